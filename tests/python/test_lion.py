"""Lion on one process against its float64 reference (lion_reference.py):
the update, groups, defaults, absent gradients, the state (one moment),
the blob and its resume, ZeRO and the config."""

import json

import numpy as np
import pytest

import dsopt
from dsopt_testing import assert_fp32_close, assert_moved, random_grads, random_params
from lion_reference import LionReference, lion_groups

SIZES = [1, 7, 33, 1000, 4099]
STEPS = 25


def lion_config(**params):
    return {"optimizer": {"type": "Lion", "params": params}}


def run(config, params, grads_per_step, groups=None):
    initial = [p.copy() for p in params]
    ref = LionReference(params, lion_groups(config), groups)
    with dsopt.Optimizer(config, params, groups=groups) as opt:
        for k, grads in enumerate(grads_per_step):
            info = opt.step(grads)
            ref.step(grads)
            assert not info.skipped and info.step == k + 1
        moments = [opt.state_view(i, "exp_avg").data.copy() for i in range(len(params))]
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i} (numel {p.size})")
        np.testing.assert_array_equal(moments[i], ref.m[i], err_msg=f"exp_avg of param {i}")
    assert_moved(np.concatenate(initial), np.concatenate(params))
    return ref


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("betas", [[0.9, 0.99], [0.8, 0.95]])
def test_update_matches_reference(rng, weight_decay, betas):
    config = lion_config(lr=3e-3, betas=betas, weight_decay=weight_decay)
    run(config, random_params(rng, SIZES), [random_grads(rng, SIZES) for _ in range(STEPS)])


def test_defaults_are_the_papers(rng):
    config = lion_config()
    run(config, random_params(rng, SIZES), [random_grads(rng, SIZES) for _ in range(STEPS)])
    with dsopt.Optimizer(config, random_params(rng, [3])) as opt:
        params = opt.config["optimizer"]["params"]
        assert params == {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0}
        assert opt.config["param_groups"] == [params]


def test_param_groups_use_their_own_hyperparameters(rng):
    sizes = [33, 1000, 7, 4099]
    config = lion_config(lr=1e-3, weight_decay=0.05)
    config["param_groups"] = [{"lr": 2e-3, "betas": [0.95, 0.98]}, {"weight_decay": 0.0}]
    run(config, random_params(rng, sizes), [random_grads(rng, sizes) for _ in range(STEPS)],
        groups=[0, 1, 1, 0])


def test_one_moment_and_half_of_adamws_state(rng):
    params = random_params(rng, SIZES)
    with dsopt.Optimizer(lion_config(), [p.copy() for p in params]) as lion, \
            dsopt.Optimizer({"optimizer": {"type": "AdamW"}}, [p.copy() for p in params]) as adamw:
        assert lion.state_names() == ["exp_avg"]
        with pytest.raises(dsopt.InvalidArgument, match="exp_avg_sq"):
            lion.state_view(0, "exp_avg_sq")
        numel = sum(p.size for p in params)
        assert lion.state_memory_usage()["host"] * 2 == adamw.state_memory_usage()["host"]
        assert lion.state_memory_usage()["host"] == 4 * numel
        assert len(adamw.state_dict()) - len(lion.state_dict()) >= 4 * numel


def test_blob_resumes_bit_identically(rng):
    params = random_params(rng, SIZES)
    grads = [random_grads(rng, SIZES) for _ in range(8)]
    config = lion_config(lr=1e-3, weight_decay=0.1)
    straight = [p.copy() for p in params]
    with dsopt.Optimizer(config, straight) as opt:
        for g in grads:
            opt.step(g)
    resumed = [p.copy() for p in params]
    with dsopt.Optimizer(config, resumed) as opt:
        for g in grads[:4]:
            opt.step(g)
        blob = opt.state_dict()
        saved = [p.copy() for p in resumed]
    fresh = [p.copy() for p in saved]
    with dsopt.Optimizer(config, fresh) as opt:
        opt.load_state_dict(blob)
        assert opt.state_view(3, "exp_avg").data.any()
        for g in grads[4:]:
            opt.step(g)
    for a, b in zip(fresh, straight):
        np.testing.assert_array_equal(a, b)
    with dsopt.Optimizer({"optimizer": {"type": "AdamW"}}, [p.copy() for p in saved]) as adamw:
        with pytest.raises(dsopt.Mismatch, match="Lion"):
            adamw.load_state_dict(blob)


def test_absent_gradients_leave_parameters_and_moments_alone(rng):
    sizes = [33, 1000, 7]
    params = random_params(rng, sizes)
    config = lion_config(lr=1e-3, weight_decay=0.1)
    ref = LionReference(params, lion_groups(config))
    with dsopt.Optimizer(config, params) as opt:
        for k in range(6):
            grads = random_grads(rng, sizes)
            if k % 2:
                grads[1] = None
            opt.step(grads)
            ref.step(grads, skip=(1,) if k % 2 else ())
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i])


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_on_one_rank_equals_stage_0(rng, stage):
    params = random_params(rng, SIZES)
    grads = [random_grads(rng, SIZES) for _ in range(6)]
    config = lion_config(lr=1e-3, weight_decay=0.1)
    plain = [p.copy() for p in params]
    with dsopt.Optimizer(config, plain) as opt:
        for g in grads:
            opt.step(g)
    sharded = [p.copy() for p in params]
    zero = dict(config, zero_optimization={"stage": stage, "reduce_bucket_size": 96})
    with dsopt.Optimizer(zero, sharded) as opt:
        for g in grads:
            opt.step(g)
        blob = opt.state_dict()
    for a, b in zip(sharded, plain):
        np.testing.assert_array_equal(a, b)
    with dsopt.Optimizer(config, [p.copy() for p in sharded]) as opt:
        opt.load_state_dict_shards([blob])
        np.testing.assert_array_equal(opt.state_view(4, "exp_avg").data.size, SIZES[4])


@pytest.mark.parametrize("key, value, match", [
    ("eps", 1e-8, "unknown key"),
    ("bias_correction", True, "unknown key"),
    ("lr", -1.0, "must be >= 0"),
    ("betas", [0.9, 1.0], "each beta"),
    ("weight_decay", -0.1, "must be >= 0"),
])
def test_bad_keys_are_rejected(key, value, match):
    with pytest.raises(dsopt.InvalidArgument, match=match):
        dsopt.Optimizer(lion_config(**{key: value}), [np.zeros(3, np.float32) + 1])


def test_group_eps_is_rejected():
    config = lion_config()
    config["param_groups"] = [{"eps": 1e-6}]
    with pytest.raises(dsopt.InvalidArgument, match="param_groups\\[0\\].eps"):
        dsopt.Optimizer(config, [np.ones(3, np.float32)])


def test_type_is_case_insensitive_and_canonical_text_reloads(rng):
    with dsopt.Optimizer({"optimizer": {"type": "lion"}}, random_params(rng, [5])) as opt:
        text = json.dumps(opt.config)
        assert opt.config["optimizer"]["type"] == "Lion"
    with dsopt.Optimizer(json.loads(text), random_params(rng, [5])) as opt:
        assert opt.config["optimizer"]["params"]["lr"] == 1e-4


def test_group_params_are_lions_own(rng):
    with dsopt.Optimizer(lion_config(lr=1e-3), random_params(rng, [5])) as opt:
        opt.set_group_param(0, "beta2", 0.9)
        opt.set_group_param(0, "weight_decay", 0.5)
        assert opt.get_group_param(0, "beta2") == 0.9
        with pytest.raises(dsopt.InvalidArgument, match="Lion has no hyperparameter \"eps\""):
            opt.set_group_param(0, "eps", 1e-6)
        with pytest.raises(dsopt.InvalidArgument, match="Lion has no hyperparameter \"eps\""):
            opt.get_group_param(0, "eps")
        assert opt.config["param_groups"] == [{"lr": 1e-3, "betas": [0.9, 0.9], "weight_decay": 0.5}]
