"""How skipped steps are reported: StepInfo.consecutive_skips, the
rate-limited dsopt.SkippedStepWarning, and dsopt.NonFiniteError when a run
stops progressing (max_consecutive_skips, fp16 overflow at min_loss_scale).
Local communicator, in process. Bad values of the new config keys are in
test_bad_inputs.py."""

import warnings

import numpy as np
import pytest

import dsopt
from dsopt_testing import adam_config, random_grads, random_params, with_keys

SIZES = [7, 33]
CONFIG = adam_config("AdamW", lr=1e-3, weight_decay=0.01)
FP16_AT_MIN_SCALE_NEXT = {"enabled": True, "initial_scale_power": 1, "hysteresis": 1,
                          "min_loss_scale": 1}


def nan_grads(rng):
    grads = random_grads(rng, SIZES)
    grads[1][3] = np.nan
    return grads


def step_recording_warnings(opt, grads):
    """(StepInfo, the SkippedStepWarnings the step emitted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = opt.step(grads)
    return info, [w for w in caught if issubclass(w.category, dsopt.SkippedStepWarning)]


def skip_until_error(opt, rng, limit):
    """Skips with NaN gradients until step() raises; returns the error and
    how many steps that took. Fails after ``limit`` steps."""
    for k in range(1, limit + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
                opt.step(nan_grads(rng))
        except dsopt.NonFiniteError as error:
            return error, k
    pytest.fail(f"no NonFiniteError in {limit} skipped steps")


def test_error_class_and_warning_class_are_exported():
    assert issubclass(dsopt.NonFiniteError, dsopt.DsoptError)
    assert dsopt.NonFiniteError.status == dsopt.lib.DSOPT_ENONFINITE == -10
    assert issubclass(dsopt.SkippedStepWarning, RuntimeWarning)
    assert {"NonFiniteError", "SkippedStepWarning"} <= set(dsopt.__all__)


def test_consecutive_skips_counts_the_run_and_resets_when_a_step_applies(rng):
    params = random_params(rng, SIZES)
    with dsopt.Optimizer(CONFIG, params) as opt, warnings.catch_warnings():
        warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
        assert opt.step(random_grads(rng, SIZES)).consecutive_skips == 0
        runs = [opt.step(nan_grads(rng)).consecutive_skips for _ in range(3)]
        applied = opt.step(random_grads(rng, SIZES))
        again = opt.step(nan_grads(rng))
    assert runs == [1, 2, 3]
    assert not applied.skipped and applied.consecutive_skips == 0 and applied.step == 2
    assert again.skipped and again.consecutive_skips == 1


def test_error_is_raised_at_exactly_the_max_consecutive_skips_th_skip(rng):
    params = random_params(rng, SIZES)
    with dsopt.Optimizer(with_keys(CONFIG, max_consecutive_skips=3), params) as opt:
        opt.step(random_grads(rng, SIZES))
        before = [p.copy() for p in params]
        error, steps = skip_until_error(opt, rng, 10)
        assert steps == 3
        assert error.status == -10
        assert "max_consecutive_skips" in str(error)
        assert isinstance(error.info, dsopt.StepInfo)
        assert error.info.skipped and error.info.consecutive_skips == 3 and error.info.step == 1
        assert all(np.array_equal(p, b) for p, b in zip(params, before))
        # Training continues after catching it.
        info = opt.step(random_grads(rng, SIZES))
        assert not info.skipped and info.step == 2 and info.consecutive_skips == 0
        assert not all(np.array_equal(p, b) for p, b in zip(params, before))


@pytest.mark.parametrize("fp16", [None, FP16_AT_MIN_SCALE_NEXT], ids=["fp32", "fp16_min_scale"])
def test_max_consecutive_skips_zero_never_raises(rng, fp16):
    params = random_params(rng, SIZES)
    config = with_keys(CONFIG, max_consecutive_skips=0)
    if fp16 is not None:
        config["fp16"] = fp16
    with dsopt.Optimizer(config, params) as opt, warnings.catch_warnings():
        warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
        for k in range(1, 121):
            assert opt.step(nan_grads(rng)).consecutive_skips == k


def test_fp16_overflow_at_min_loss_scale_raises(rng):
    params = random_params(rng, SIZES)
    config = with_keys(CONFIG, fp16=FP16_AT_MIN_SCALE_NEXT)
    with dsopt.Optimizer(config, params) as opt:
        before = [p.copy() for p in params]
        first, warned = step_recording_warnings(opt, nan_grads(rng))  # at scale 2: halves to 1
        assert first.skipped and first.loss_scale == 1.0 and len(warned) == 1
        with pytest.raises(dsopt.NonFiniteError) as excinfo:
            opt.step(nan_grads(rng))                                   # at scale 1: cannot halve
        assert excinfo.value.status == -10
        assert "min_loss_scale" in str(excinfo.value)
        assert excinfo.value.info.skipped and excinfo.value.info.loss_scale == 1.0
        assert all(np.array_equal(p, b) for p, b in zip(params, before))
        info = opt.step(random_grads(rng, SIZES))
        assert not info.skipped and info.step == 1


def test_warning_on_first_skip_then_only_at_10_100_1000_in_a_row(rng):
    params = random_params(rng, SIZES)
    with dsopt.Optimizer(with_keys(CONFIG, max_consecutive_skips=0), params) as opt:
        info, warned = step_recording_warnings(opt, random_grads(rng, SIZES))
        assert warned == []
        info, warned = step_recording_warnings(opt, nan_grads(rng))
        assert len(warned) == 1
        text = str(warned[0].message)
        assert "Inf/NaN" in text and "1 skipped in a row" in text
        assert "max_consecutive_skips" in text and "NonFiniteError" in text
        assert warned[0].filename == __file__  # points at the caller of step()
        # A later isolated skip (as fp16 loss scaling has now and then) is quiet.
        step_recording_warnings(opt, random_grads(rng, SIZES))
        warned_at = []
        for _ in range(100):
            info, warned = step_recording_warnings(opt, nan_grads(rng))
            if warned:
                warned_at.append(info.consecutive_skips)
                assert f"{info.consecutive_skips} skipped in a row" in str(warned[0].message)
    assert warned_at == [10, 100]


def test_step_that_raises_does_not_warn_and_counts_as_the_first_report(rng):
    params = random_params(rng, SIZES)
    fp16 = {"enabled": True, "initial_scale_power": 0, "min_loss_scale": 1, "hysteresis": 1,
            "loss_scale_window": 2}
    with dsopt.Optimizer(with_keys(CONFIG, fp16=fp16), params) as opt:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(dsopt.NonFiniteError):
                opt.step(nan_grads(rng))                    # at scale 1 = min_loss_scale
        assert not any(issubclass(w.category, dsopt.SkippedStepWarning) for w in caught)
        for _ in range(2):
            info, _ = step_recording_warnings(opt, random_grads(rng, SIZES))
        assert info.loss_scale == 2.0
        info, warned = step_recording_warnings(opt, nan_grads(rng))  # at scale 2: halves
        assert info.skipped and info.consecutive_skips == 1
        assert warned == []


def test_one_bit_adam_accepts_the_stabilize_keys(rng):
    params = random_params(rng, SIZES)
    for stabilize in (True, False):
        config = adam_config("OneBitAdam", lr=1e-3, freeze_step=2, stabilize=stabilize,
                             stabilize_limit=0.5)
        with dsopt.Optimizer(config, params) as opt:
            for _ in range(4):
                info = opt.step(random_grads(rng, SIZES))
            assert info.compressed and info.step == 4
