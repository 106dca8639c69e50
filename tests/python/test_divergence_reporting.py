"""How a divergence that stays finite is reported: StepInfo.diverging
follows the rule of docs/reference/c-api.md (examples/python/divergence_rule.py replays it on
the reported norms), and dsopt.DivergenceWarning is issued once per
episode, on its first step. Synthetic gradients whose norm follows a chosen
course; local communicator, in process."""

import sys
import warnings

import numpy as np
import pytest

import conftest
import dsopt

sys.path.insert(0, str(conftest.REPO_ROOT / "examples" / "python"))
import divergence_rule  # noqa: E402

NUMEL = 64
CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 0.0}}, "report_grad_norm": True, "threads": 1}


def course(*pieces):
    """[(steps, scale), ...] -> one scale per step."""
    return [scale for steps, scale in pieces for _ in range(steps)]


def run(scales, config=CONFIG, seed=0):
    """Steps with gradients of the given scales; returns (StepInfos, the
    DivergenceWarnings with the step count at which each was issued)."""
    rng = np.random.default_rng(seed)
    direction = rng.standard_normal(NUMEL).astype(np.float32)
    params = [np.zeros(NUMEL, np.float32)]
    infos, warned = [], []
    with dsopt.Optimizer(config, params) as opt, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for scale in scales:
            noise = 0.3 * rng.standard_normal(NUMEL).astype(np.float32)
            infos.append(opt.step([(scale * (direction + noise)).astype(np.float32)]))
            warned += [(len(infos), w) for w in caught if issubclass(w.category, dsopt.DivergenceWarning)]
            caught.clear()
    return infos, warned


def test_warning_class_and_field_are_exported():
    assert issubclass(dsopt.DivergenceWarning, RuntimeWarning)
    assert "DivergenceWarning" in dsopt.__all__
    assert dsopt.StepInfo.__dataclass_fields__["diverging"].default is False


def test_two_blow_ups_warn_twice_at_their_first_reported_steps():
    scales = course((40, 1.0), (15, 1e3), (30, 1.0), (10, 1e4), (20, 1.0))
    infos, warned = run(scales)
    flags, _ = divergence_rule.replay([i.grad_norm for i in infos])
    assert [i.diverging for i in infos] == flags
    episodes = divergence_rule.episodes(flags)
    assert [first for first, _ in episodes] == [43, 88]  # the third step of each jump
    assert [k for k, _ in warned] == [43, 88]
    assert all("diverging at step" in str(w.message) and "divergence_check" in str(w.message)
               for _, w in warned)


def test_noisy_and_slowly_growing_runs_never_warn():
    rng = np.random.default_rng(5)
    noisy = list(np.exp(rng.standard_normal(300)))  # log-normal: steps differ by e^2 and more
    growing = [1.01 ** k for k in range(300)]       # 20x over the run: the reference follows
    for scales in (noisy, growing):
        infos, warned = run(scales)
        assert not any(i.diverging for i in infos) and not warned
        _, ratios = divergence_rule.replay([i.grad_norm for i in infos])
        assert divergence_rule.margin(ratios) < 20.0


def test_a_norm_climbing_faster_than_the_reference_follows_warns():
    """x1.1 a step from step 40: the reference follows at most 2x per 50
    steps, so the norm gets 20x above it within about 30 steps."""
    infos, warned = run(course((40, 1.0)) + [1.1 ** k for k in range(1, 61)])
    flags, _ = divergence_rule.replay([i.grad_norm for i in infos])
    assert [i.diverging for i in infos] == flags
    assert len(warned) == 1 and 50 < warned[0][0] < 80, [k for k, _ in warned]


def test_turned_off_or_tuned_by_the_config():
    scales = course((40, 1.0), (10, 10.0), (20, 1.0))  # 10x: below the default factor 20
    infos, warned = run(scales)
    assert not any(i.diverging for i in infos) and not warned
    tuned = {"factor": 5, "min_steps": 20, "count": 2, "window": 4}
    infos, warned = run(scales, dict(CONFIG, divergence_check=tuned))
    flags, _ = divergence_rule.replay([i.grad_norm for i in infos], factor=5, min_steps=20, count=2,
                                      window=4)
    assert [i.diverging for i in infos] == flags and [k for k, _ in warned] == [42]
    infos, warned = run(course((40, 1.0), (10, 1e4)), dict(CONFIG, divergence_check={"enabled": False}))
    assert not any(i.diverging for i in infos) and not warned


@pytest.mark.parametrize("section, message", [
    (True, "divergence_check"),
    ({"factor": 0.5}, "divergence_check.factor"),
    ({"count": 5, "window": 4}, "divergence_check.count"),
    ({"windows": 4}, "divergence_check.windows"),
])
def test_bad_settings_are_rejected_naming_the_key(section, message):
    with pytest.raises(dsopt.InvalidArgument, match=message.replace(".", r"\.")):
        dsopt.Optimizer(dict(CONFIG, divergence_check=section), [np.zeros(4, np.float32)])


def test_a_run_resumed_mid_episode_reports_as_the_uninterrupted_one():
    scales = course((40, 1.0), (15, 1e3), (20, 1.0))
    rng = np.random.default_rng(1)
    grads = [(s * rng.standard_normal(NUMEL)).astype(np.float32) for s in scales]
    params = [np.zeros(NUMEL, np.float32)]
    with dsopt.Optimizer(CONFIG, params) as opt, warnings.catch_warnings():
        warnings.simplefilter("ignore", dsopt.DivergenceWarning)
        whole = [opt.step([g]).diverging for g in grads]
        opt2 = dsopt.Optimizer(CONFIG, [np.zeros(NUMEL, np.float32)])
        for g in grads[:45]:
            opt2.step([g])
        blob = opt2.state_dict()
        opt2.close()
        with dsopt.Optimizer(CONFIG, [np.zeros(NUMEL, np.float32)]) as opt3:
            opt3.load_state_dict(blob)
            resumed = [opt3.step([g]).diverging for g in grads[45:]]
    assert whole[44] and resumed == whole[45:]
