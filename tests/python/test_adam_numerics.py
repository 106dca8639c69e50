"""Adam (L2) and AdamW against the float64 reference of docs/optimizers/adam.md."""

import numpy as np
import pytest

import dsopt
from dsopt_testing import (
    adam_config, assert_fp32_close, random_grads, random_params, reference_for, run_fp32,
)

STEPS = 25
SIZES = [7, 33, 1000]


def grad_sequence(rng, sizes, steps=STEPS):
    return [random_grads(rng, sizes) for _ in range(steps)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_adamw_update_matches_reference(rng, weight_decay, bias_correction):
    config = adam_config("AdamW", lr=5e-3, betas=[0.8, 0.99], eps=1e-6,
                         weight_decay=weight_decay, bias_correction=bias_correction)
    run_fp32(config, random_params(rng, SIZES), grad_sequence(rng, SIZES))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_adam_l2_update_matches_reference(rng, weight_decay, bias_correction):
    config = adam_config("Adam", lr=5e-3, betas=[0.85, 0.995], eps=1e-7,
                         weight_decay=weight_decay, bias_correction=bias_correction,
                         adam_w_mode=False)
    run_fp32(config, random_params(rng, SIZES), grad_sequence(rng, SIZES))


def test_adam_type_without_adam_w_mode_decays_decoupled(rng):
    config = adam_config("Adam", lr=1e-2, weight_decay=0.2)
    params = random_params(rng, SIZES)
    grads = grad_sequence(rng, SIZES)
    l2 = reference_for(adam_config("Adam", lr=1e-2, weight_decay=0.2, adam_w_mode=False), params)
    for g in grads:
        l2.step(g)
    ref = run_fp32(config, params, grads)
    assert ref.decoupled
    with pytest.raises(AssertionError):  # the two rules are told apart
        assert_fp32_close(params[2], l2.p[2])


def test_default_hyperparameters_match_reference(rng):
    run_fp32(adam_config("AdamW"), random_params(rng, SIZES), grad_sequence(rng, SIZES))


def test_odd_sizes_match_reference(rng):
    sizes = [1, 7, 33, 1000, 4099, 100003]
    config = adam_config("AdamW", lr=2e-3, weight_decay=0.05)
    run_fp32(config, random_params(rng, sizes), grad_sequence(rng, sizes))


def test_odd_sizes_l2_match_reference(rng):
    sizes = [1, 33, 4099, 100003]
    config = adam_config("Adam", lr=2e-3, weight_decay=0.05, adam_w_mode=False)
    run_fp32(config, random_params(rng, sizes), grad_sequence(rng, sizes))


TWO_GROUPS = [
    {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
    {"lr": 3e-3, "betas": [0.7, 0.95], "eps": 1e-4, "weight_decay": 0.0},
]


@pytest.mark.parametrize("opt_type, extra", [("AdamW", {}), ("Adam", {"adam_w_mode": False})])
def test_param_groups_use_their_own_hyperparameters(rng, opt_type, extra):
    sizes = [33, 1000, 7, 4099]
    group_of = [0, 1, 1, 0]
    config = adam_config(opt_type, **extra)
    config["param_groups"] = TWO_GROUPS
    run_fp32(config, random_params(rng, sizes), grad_sequence(rng, sizes), groups=group_of)


def test_param_groups_given_as_per_param_dicts(rng):
    sizes = [33, 1000, 7]
    dict_groups = [TWO_GROUPS[0], TWO_GROUPS[1], TWO_GROUPS[0]]
    params = random_params(rng, sizes)
    grads = grad_sequence(rng, sizes)
    config = adam_config("AdamW")
    explicit = dict(config, param_groups=TWO_GROUPS)
    ref = reference_for(explicit, params, [0, 1, 0])
    with dsopt.Optimizer(config, params, groups=dict_groups) as opt:
        assert opt.num_groups == 2
        assert opt.get_group_lr(1) == pytest.approx(TWO_GROUPS[1]["lr"])
        for g in grads:
            opt.step(g)
            ref.step(g)
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i}")


def test_set_lr_mid_run_changes_every_group(rng):
    sizes = [33, 1000]
    config = adam_config("AdamW", weight_decay=0.1)
    config["param_groups"] = TWO_GROUPS

    def schedule(k, opt, ref):
        if k in (8, 17):
            lr = 2e-2 if k == 8 else 5e-4
            opt.lr = lr
            ref.set_lr(lr)
            assert opt.lr == lr
            assert opt.get_group_lr(1) == lr

    run_fp32(config, random_params(rng, sizes), grad_sequence(rng, sizes),
             groups=[0, 1], on_step=schedule)


def test_set_group_lr_mid_run_changes_one_group(rng):
    sizes = [33, 1000, 7]
    config = adam_config("AdamW", weight_decay=0.1)
    config["param_groups"] = TWO_GROUPS

    def schedule(k, opt, ref):
        if k == 10:
            opt.set_group_lr(1, 4e-2)
            ref.set_lr(4e-2, group=1)
            assert opt.get_group_lr(0) == pytest.approx(TWO_GROUPS[0]["lr"])
            assert opt.get_group_lr(1) == 4e-2
        if k == 20:
            opt.set_group_lr(0, 0.0)  # lr 0 freezes group 0
            ref.set_lr(0.0, group=0)

    run_fp32(config, random_params(rng, sizes), grad_sequence(rng, sizes),
             groups=[0, 1, 1], on_step=schedule)


def test_config_as_json_text_equals_dict(rng):
    import json

    config = adam_config("AdamW", lr=3e-3, weight_decay=0.01)
    params = random_params(rng, SIZES)
    twin = [p.copy() for p in params]
    grads = grad_sequence(rng, SIZES, steps=5)
    with dsopt.Optimizer(config, params) as a, dsopt.Optimizer(json.dumps(config), twin) as b:
        for g in grads:
            a.step(g)
            b.step(g)
    for p, q in zip(params, twin):
        assert np.array_equal(p, q)
