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


@pytest.mark.parametrize("opt_type,zero", [("AdamW", 0), ("AdamW", 2), ("OneBitAdam", 0)])
def test_clipping_set_mid_run_equals_a_run_created_with_it(rng, opt_type, zero):
    """gradient_clipping set between steps (as frameworks do with their own
    max-norm setting) acts from the next step: bit for bit the run whose
    config had it from the start, switched on, changed and off again."""
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    grads = [random_grads(rng, SIZES, scale=0.2 + k % 4) for k in range(12)]
    schedule = {0: 0.0, 3: 30.0, 6: 5.0, 9: 0.0}  # from step k on

    def run(set_mid_run):
        ps = [p.copy() for p in params]
        out = []
        for start, clip in schedule.items():
            config = adam_config(opt_type, lr=1e-2, weight_decay=0.01)
            if opt_type == "OneBitAdam":
                config["optimizer"]["params"]["freeze_step"] = 4
            if zero:
                config["zero_optimization"] = {"stage": zero}
            if not set_mid_run:
                config["gradient_clipping"] = clip
            out.append(config)
        if set_mid_run:
            with dsopt.Optimizer(out[0], ps) as opt:
                norms = []
                for k, g in enumerate(grads):
                    if k in schedule:
                        opt.gradient_clipping = schedule[k]
                        assert opt.gradient_clipping == schedule[k]
                    norms.append(opt.step(g).grad_norm)
            return ps, norms
        # The reference: a new optimizer per clipping setting, the state
        # carried over through a state blob.
        blob, norms = None, []
        for (start, clip), config in zip(schedule.items(), out):
            stop = min([s for s in schedule if s > start], default=len(grads))
            with dsopt.Optimizer(config, ps) as opt:
                if blob is not None:
                    opt.load_state_dict(blob)
                for k in range(start, stop):
                    norms.append(opt.step(grads[k]).grad_norm)
                blob = opt.state_dict()
        return ps, norms

    mid_params, mid_norms = run(True)
    ref_params, ref_norms = run(False)
    for i in range(len(SIZES)):
        np.testing.assert_array_equal(mid_params[i], ref_params[i], err_msg=f"param {i}")
    assert [n > 0 for n in mid_norms] == [n > 0 for n in ref_norms]
    assert mid_norms[3:9] == ref_norms[3:9]  # computed while clipping is on


def test_clipping_setter_rejects_bad_values_and_changes_nothing(rng):
    p = rng.standard_normal(10).astype(np.float32)
    config = adam_config("AdamW")
    config["gradient_clipping"] = 2.0
    with dsopt.Optimizer(config, [p]) as opt:
        for bad in (-1.0, float("nan"), float("inf")):
            with pytest.raises(dsopt.InvalidArgument, match="gradient_clipping"):
                opt.gradient_clipping = bad
            assert opt.gradient_clipping == 2.0
