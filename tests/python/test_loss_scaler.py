"""fp16 loss scaling: dynamic growth, hysteresis, floor, static scale, and
skipped steps that change nothing."""

import numpy as np
import pytest

import dsopt
from adam_reference import LossScalerReference
from dsopt_testing import adam_config, assert_fp32_close, random_grads, reference_for
from halfprec import bf16_bits_to_float, to_bf16_bits

SIZES = [7, 33]


def fp16_config(**fp16):
    config = adam_config("AdamW", lr=1e-2, weight_decay=0.05)
    config["fp16"] = dict(enabled=True, **fp16)
    return config


def poison(grads, k, rng):
    """Puts one Inf, -Inf or NaN into one gradient (varies with k)."""
    bad = [g.copy() for g in grads]
    which = k % len(bad)
    bad[which][rng.integers(bad[which].size)] = [np.inf, -np.inf, np.nan][k % 3]
    return bad


def run_sequence(rng, config, scaler, overflow_steps, steps, params_dtype=np.float32):
    """Runs ``steps`` steps with overflows at ``overflow_steps`` and checks,
    step by step, loss_scale / skipped / step against the reference scaler,
    that skipped steps change nothing, and the final parameters."""
    params = [rng.standard_normal(n).astype(params_dtype) for n in SIZES]
    ref = reference_for(config, [p.astype(np.float64) for p in params])
    applied = 0
    with dsopt.Optimizer(config, params) as opt:
        assert opt.loss_scale == scaler.scale
        for k in range(steps):
            scale = opt.loss_scale
            true_grads = random_grads(rng, SIZES)
            grads = [(g * np.float32(scale)).astype(np.float32) for g in true_grads]
            overflow = k in overflow_steps
            if overflow:
                grads = poison(grads, k, rng)
            before = [p.copy() for p in params]
            info = opt.step(grads)
            expected_scale = scaler.update(overflow)
            assert info.skipped == overflow, f"step {k}"
            assert info.loss_scale == expected_scale, f"step {k}"
            assert opt.loss_scale == expected_scale, f"step {k}"
            if overflow:
                for p, b in zip(params, before):
                    assert np.array_equal(p, b), f"skipped step {k} changed a parameter"
            else:
                applied += 1
                ref.step(true_grads)
            assert info.step == applied, f"step {k}"
    return params, ref


def check_final(params, ref):
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i}")


def test_dynamic_scale_doubles_after_each_clean_window(rng):
    config = fp16_config(initial_scale_power=4, loss_scale_window=3)
    scaler = LossScalerReference(initial_scale_power=4, window=3)
    params, ref = run_sequence(rng, config, scaler, set(), 25)
    assert scaler.scale == 2.0 ** (4 + 25 // 3)
    check_final(params, ref)


def test_overflows_halve_the_scale_after_hysteresis_is_used_up(rng):
    config = fp16_config(initial_scale_power=10, loss_scale_window=4, hysteresis=3)
    scaler = LossScalerReference(initial_scale_power=10, window=4, hysteresis=3)
    overflows = {2, 3, 5, 6, 7, 8, 13, 14, 15, 16}
    params, ref = run_sequence(rng, config, scaler, overflows, 25)
    check_final(params, ref)


def test_hysteresis_one_halves_on_every_overflow(rng):
    config = fp16_config(initial_scale_power=8, loss_scale_window=5, hysteresis=1)
    scaler = LossScalerReference(initial_scale_power=8, window=5, hysteresis=1)
    params, ref = run_sequence(rng, config, scaler, {1, 2, 9, 17, 18}, 25)
    check_final(params, ref)


def test_consecutive_hysteresis_refills_after_every_clean_step(rng):
    kwargs = dict(initial_scale_power=10, loss_scale_window=6, hysteresis=2)
    config = fp16_config(consecutive_hysteresis=True, **kwargs)
    scaler = LossScalerReference(initial_scale_power=10, window=6, hysteresis=2,
                                 consecutive_hysteresis=True)
    overflows = {1, 3, 5, 6, 10, 12, 13, 14, 20}
    params, ref = run_sequence(rng, config, scaler, overflows, 25)
    check_final(params, ref)
    # Without refilling, the same sequence ends at another scale: the test tells them apart.
    plain = LossScalerReference(initial_scale_power=10, window=6, hysteresis=2)
    for k in range(25):
        plain.update(k in overflows)
    assert plain.scale != scaler.scale


def test_scale_never_goes_below_min_loss_scale(rng):
    # Overflowing at the minimum is reported (DSOPT_ENONFINITE) unless the
    # report is off; the scaler rule itself is what this test follows.
    config = fp16_config(initial_scale_power=3, loss_scale_window=50, hysteresis=1,
                         min_loss_scale=2)
    config["max_consecutive_skips"] = 0
    scaler = LossScalerReference(initial_scale_power=3, window=50, hysteresis=1, min_scale=2)
    params, ref = run_sequence(rng, config, scaler, set(range(2, 12)), 20)
    assert scaler.scale == 2.0
    check_final(params, ref)


def test_static_scale_never_changes_and_overflows_still_skip(rng):
    config = fp16_config(loss_scale=128)
    scaler = LossScalerReference(static_scale=128)
    params, ref = run_sequence(rng, config, scaler, {0, 4, 5, 11}, 25)
    check_final(params, ref)


def test_fp16_params_with_dynamic_scaling_skip_and_follow_master(rng):
    from halfprec import assert_within_ulps, to_fp16

    config = fp16_config(initial_scale_power=12, loss_scale_window=4, hysteresis=2)
    scaler = LossScalerReference(initial_scale_power=12, window=4, hysteresis=2)
    params, ref = run_sequence(rng, config, scaler, {3, 4, 9}, 25, params_dtype=np.float16)
    for i, p in enumerate(params):
        assert_within_ulps(p, to_fp16(ref.p[i]), what=f"param {i}")


def as_dtype(grads, grad_dtype):
    """The gradients in ``grad_dtype`` and their exact float64 values."""
    if grad_dtype == "float32":
        return grads, grads
    if grad_dtype == "float16":
        half = [g.astype(np.float16) for g in grads]
        return half, [h.astype(np.float64) for h in half]
    bits = [to_bf16_bits(g) for g in grads]
    return [dsopt.bf16(b) for b in bits], [bf16_bits_to_float(b) for b in bits]


@pytest.mark.parametrize("grad_dtype", ["float32", "float16", "bfloat16"])
def test_nonfinite_gradient_skips_without_loss_scaling(rng, grad_dtype):
    config = adam_config("AdamW", lr=1e-2)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    ref = reference_for(config, params)
    with dsopt.Optimizer(config, params) as opt:
        for k in range(22):
            poisoned = k % 7 == 3
            grads = random_grads(rng, SIZES)
            given, exact = as_dtype(poison(grads, k, rng) if poisoned else grads, grad_dtype)
            before = [p.copy() for p in params]
            info = opt.step(given)
            assert info.loss_scale == 1.0
            assert opt.loss_scale == 1.0
            assert info.skipped == poisoned, f"step {k}"
            if poisoned:
                assert all(np.array_equal(p, b) for p, b in zip(params, before))
            else:
                ref.step(exact)
    check_final(params, ref)


def test_skip_nonfinite_false_applies_the_step(rng):
    config = adam_config("AdamW", lr=1e-2)
    config["skip_nonfinite"] = False
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    with dsopt.Optimizer(config, params) as opt:
        grads = random_grads(rng, SIZES)
        grads[1][5] = np.nan
        info = opt.step(grads)
    assert not info.skipped and info.step == 1
    assert np.isnan(params[1][5])
