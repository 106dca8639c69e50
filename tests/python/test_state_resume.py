"""Save, destroy, create, load, go on: bit-identical to never stopping."""

import numpy as np
import pytest

import dsopt
from dsopt_testing import adam_config
from halfprec import to_bf16_bits

TOTAL = 25
SIZES = [7, 33, 1000, 4099]
OVERFLOW_STEPS = {3, 12, 13}


def fp32_case():
    config = adam_config("AdamW", lr=1e-2, weight_decay=0.1)
    config["param_groups"] = [{"lr": 5e-3}, {"betas": [0.8, 0.99], "weight_decay": 0.0}]
    return config, np.float32, [0, 1, 1, 0]


def fp16_dynamic_case():
    config = adam_config("Adam", lr=1e-2, weight_decay=0.05, adam_w_mode=False)
    config["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 4,
                      "hysteresis": 2}
    config["gradient_clipping"] = 50.0
    return config, np.float16, None


def bf16_case():
    config = adam_config("AdamW", lr=1e-2, weight_decay=0.1)
    config["bf16"] = {"enabled": True}
    return config, "bfloat16", None


CASES = {"fp32_groups": fp32_case, "fp16_dynamic_scale": fp16_dynamic_case, "bf16": bf16_case}


def make_params(rng, dtype):
    if dtype == "bfloat16":
        return [to_bf16_bits(rng.standard_normal(n)) for n in SIZES]
    return [rng.standard_normal(n).astype(dtype) for n in SIZES]


def as_inputs(params, dtype):
    return [dsopt.bf16(p) for p in params] if dtype == "bfloat16" else params


def gradients(seed, k, scale):
    rng = np.random.default_rng([seed, k])
    grads = [(rng.standard_normal(n) * (1 + i) * scale).astype(np.float32)
             for i, n in enumerate(SIZES)]
    if k in OVERFLOW_STEPS:
        grads[k % len(SIZES)][k % 7] = np.inf
    return grads


def run(opt, params, seed, steps):
    """Steps and records (params, info) after each step."""
    history = []
    for k in steps:
        info = opt.step(gradients(seed, k, opt.loss_scale))
        history.append(([p.copy() for p in params], info))
    return history


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("save_at", [1, 5, 20])
def test_resume_is_bit_identical_to_uninterrupted_run(rng, case, save_at):
    config, dtype, groups = CASES[case]()
    seed = int(rng.integers(1 << 30))
    initial = make_params(rng, dtype)

    straight = [p.copy() for p in initial]
    with dsopt.Optimizer(config, as_inputs(straight, dtype), groups=groups) as opt:
        expected = run(opt, straight, seed, range(TOTAL))
        expected_blob = opt.state_dict()

    first = [p.copy() for p in initial]
    with dsopt.Optimizer(config, as_inputs(first, dtype), groups=groups) as opt:
        run(opt, first, seed, range(save_at))
        blob = opt.state_dict()
        saved_params = [p.copy() for p in first]

    # A fresh optimizer: fp32 parameters come back from the caller's
    # checkpoint; 16-bit ones start from other values and are restored from
    # the masters in the blob.
    if dtype == np.float32:
        resumed = [p.copy() for p in saved_params]
    else:
        resumed = make_params(rng, dtype)
    with dsopt.Optimizer(config, as_inputs(resumed, dtype), groups=groups) as opt:
        opt.load_state_dict(blob)
        for p, q in zip(resumed, saved_params):
            assert np.array_equal(p, q), "load did not restore the parameters"
        assert opt.state_dict() == blob
        assert opt.loss_scale == expected[save_at - 1][1].loss_scale
        got = run(opt, resumed, seed, range(save_at, TOTAL))
        got_blob = opt.state_dict()

    for k, ((params_a, info_a), (params_b, info_b)) in enumerate(zip(expected[save_at:], got)):
        assert info_a == info_b, f"step {save_at + k}"
        for p, q in zip(params_a, params_b):
            assert np.array_equal(p.view(np.uint8), q.view(np.uint8)), f"step {save_at + k}"
    assert got_blob == expected_blob
    assert any(info.skipped for _, info in expected)


def test_state_dict_is_deterministic_and_loadable_twice(rng):
    config = adam_config("AdamW", lr=1e-2)
    params = make_params(rng, np.float32)
    with dsopt.Optimizer(config, params) as opt:
        run(opt, params, 7, range(3))
        blob = opt.state_dict()
        assert opt.state_dict() == blob
        opt.load_state_dict(blob)
        opt.load_state_dict(bytearray(blob))
        opt.load_state_dict(memoryview(blob))
        assert opt.state_dict() == blob
