"""Gradient clipping and the reported gradient norm."""

import numpy as np
import pytest

import dsopt
from adam_reference import LossScalerReference, clip_multiplier, global_norm
from dsopt_testing import adam_config, assert_fp32_close, random_grads, reference_for

SIZES = [7, 1000, 4099]
STEPS = 25


def run_clipped(rng, config, clip, scaler=None, grad_scale=1.0):
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    ref = reference_for(config, params)
    clipped_steps = 0
    with dsopt.Optimizer(config, params) as opt:
        for k in range(STEPS):
            scale = opt.loss_scale
            # Magnitudes vary so that some steps clip and some do not.
            true_grads = random_grads(rng, SIZES, scale=grad_scale * (0.2 + k % 4))
            grads = [(g * np.float32(scale)).astype(np.float32) for g in true_grads]
            info = opt.step(grads)
            norm, mul = clip_multiplier(grads, clip, scale)
            assert info.grad_norm == pytest.approx(global_norm(true_grads), rel=1e-6), f"step {k}"
            assert info.grad_norm == pytest.approx(norm, rel=1e-6)
            clipped_steps += clip > 0 and norm > clip
            ref.step(grads, mul)
            if scaler is not None:
                assert info.loss_scale == scaler.update(False)
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i}")
    return clipped_steps


def test_clipping_scales_gradients_by_coef(rng):
    config = adam_config("AdamW", lr=1e-2, weight_decay=0.05)
    config["gradient_clipping"] = 40.0
    clipped = run_clipped(rng, config, 40.0)
    assert 0 < clipped < STEPS


def test_clipping_with_l2_decay_clips_before_decay(rng):
    config = adam_config("Adam", lr=1e-2, weight_decay=0.1, adam_w_mode=False)
    config["gradient_clipping"] = 40.0
    clipped = run_clipped(rng, config, 40.0)
    assert 0 < clipped < STEPS


def test_norm_and_clipping_use_the_scale_the_gradients_were_made_with(rng):
    # The scale doubles every 3 steps; each step unscales by the previous one.
    config = adam_config("AdamW", lr=1e-2)
    config["gradient_clipping"] = 40.0
    config["fp16"] = {"enabled": True, "initial_scale_power": 5, "loss_scale_window": 3}
    scaler = LossScalerReference(initial_scale_power=5, window=3)
    clipped = run_clipped(rng, config, 40.0, scaler=scaler)
    assert 0 < clipped < STEPS


def test_static_scale_norm_is_unscaled(rng):
    config = adam_config("AdamW", lr=1e-2)
    config["gradient_clipping"] = 30.0
    config["fp16"] = {"enabled": True, "loss_scale": 1024}
    run_clipped(rng, config, 30.0, scaler=LossScalerReference(static_scale=1024))


def test_report_grad_norm_without_clipping_leaves_gradients_alone(rng):
    config = adam_config("AdamW", lr=1e-2)
    config["report_grad_norm"] = True
    clipped = run_clipped(rng, config, 0.0, grad_scale=5.0)
    assert clipped == 0


def test_grad_norm_is_minus_one_when_not_computed(rng):
    params = [rng.standard_normal(33).astype(np.float32)]
    with dsopt.Optimizer(adam_config("AdamW"), params) as opt:
        info = opt.step([rng.standard_normal(33).astype(np.float32)])
    assert info.grad_norm == -1.0
