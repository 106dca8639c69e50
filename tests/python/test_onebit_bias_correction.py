"""Bias correction of 1-bit Adam and 0/1 Adam (docs/optimizers/onebit-adam.md "Bias correction of
the 1-bit optimizers"): the warmup is Adam with both moments corrected, the
rule travels in the state blob, blobs written before it existed continue
without it, and 1-bit LAMB accepts the key and ignores it.

The bit-for-bit checks against the numpy references are in
test_onebit_adam.py and test_zero_one_adam.py (their stable_* and
bias_corrected scenarios); this file checks the rule against float64 Adam and
the blob semantics."""

import struct

import numpy as np
import pytest

import dsopt
from dsopt_testing import assert_load_rejected
from test_blob_compat import pack, sections

SIZES = (1000, 37, 4097)
RULE_SECTION = {"OneBitAdam": "onebit.rule", "ZeroOneAdam": "zoadam.rule"}


def config(kind, **params):
    p = {"lr": 1e-2, "weight_decay": 0.01}
    if kind == "ZeroOneAdam":
        p.update(var_freeze_step=6, local_step_scaler=2, local_step_clipper=4)
    else:
        p.update(freeze_step=5)
    p.update(params)
    return {"optimizer": {"type": kind, "params": p}, "threads": 1}


def start(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def grads(step):
    rng = np.random.default_rng(1000 + step)
    return [(rng.standard_normal(n) * (1 + 0.3 * step)).astype(np.float32) for n in SIZES]


def run(cfg, steps, params=None, blob=None, first=0):
    params = start() if params is None else [p.copy() for p in params]
    with dsopt.Optimizer(cfg, params) as opt:
        if blob is not None:
            opt.load_state_dict(blob)
        for k in range(first, steps):
            opt.step(grads(k))
        return params, opt.state_dict()


def test_warmup_is_adamw_with_bias_correction_in_float64():
    """1-bit Adam's warmup with the default rule against float64 AdamW
    (torch's formula: m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps), decay
    lr * wd * p), 4 updates: equal to fp32 rounding, and far from the
    uncorrected rule."""
    b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 1e-2, 0.01
    cfg = config("OneBitAdam", freeze_step=100)
    got, _ = run(cfg, 4)
    uncorrected, _ = run(config("OneBitAdam", freeze_step=100, bias_correction=False), 4)
    p = [x.astype(np.float64) for x in start()]
    m = [np.zeros_like(x) for x in p]
    v = [np.zeros_like(x) for x in p]
    for t in range(1, 5):
        for i, g in enumerate(grads(t - 1)):
            g = g.astype(np.float64)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            u = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps)
            p[i] = p[i] - lr * (u + wd * p[i])
    for a, e, u in zip(got, p, uncorrected):
        np.testing.assert_allclose(a, e, rtol=2e-6, atol=2e-6)
        assert np.max(np.abs(u - e)) > 1e-3  # the uncorrected rule is another one


@pytest.mark.parametrize("kind", ["OneBitAdam", "ZeroOneAdam"])
def test_the_compression_stage_keeps_the_variance_correction_of_its_freeze(kind):
    """After the freeze the update is m / (1 - b1^t) / (sqrt(v) rbc2 + eps)
    with rbc2 fixed: the corrected and uncorrected runs end apart, and the
    corrected one takes smaller steps (its denominator is larger)."""
    on, _ = run(config(kind), 14)
    off, _ = run(config(kind, bias_correction=False), 14)
    base = start()
    for a, b, p0 in zip(on, off, base):
        assert np.linalg.norm(a - p0) < np.linalg.norm(b - p0)


@pytest.mark.parametrize("kind", ["OneBitAdam", "ZeroOneAdam"])
def test_a_blob_written_before_the_rule_existed_continues_without_it(kind):
    """A blob without the rule section comes from a run without bias
    correction: loaded into an optimizer configured with the default (true),
    the run continues exactly as the uncorrected run it came from."""
    uncorrected = config(kind, bias_correction=False)
    mid, blob = run(uncorrected, 7)
    prefix, parts = sections(blob)
    assert RULE_SECTION[kind] in {n for n, _ in parts}
    old = pack(prefix, [(n, d) for n, d in parts if n != RULE_SECTION[kind]])
    expected, _ = run(uncorrected, 12)
    resumed, _ = run(config(kind), 12, params=mid, blob=old, first=7)
    for a, e in zip(resumed, expected):
        np.testing.assert_array_equal(a, e)
    corrected, _ = run(config(kind), 12)  # the rules differ over these steps
    assert any(not np.array_equal(a, e) for a, e in zip(corrected, expected))


@pytest.mark.parametrize("kind", ["OneBitAdam", "ZeroOneAdam"])
def test_the_blob_rule_wins_over_the_config(kind):
    mid, blob = run(config(kind), 7)
    expected, _ = run(config(kind), 12)
    resumed, _ = run(config(kind, bias_correction=False), 12, params=mid, blob=blob, first=7)
    for a, e in zip(resumed, expected):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("kind", ["OneBitAdam", "ZeroOneAdam"])
def test_an_invalid_rule_is_rejected_and_changes_nothing(kind):
    _, blob = run(config(kind), 3)
    prefix, parts = sections(blob)
    bad = pack(prefix, [(n, struct.pack("<i", 2) if n == RULE_SECTION[kind] else d) for n, d in parts])
    params = start(5)
    with dsopt.Optimizer(config(kind), params) as opt:
        opt.step(grads(0))
        assert_load_rejected(opt, params, bad, dsopt.CorruptState, "bias-correction")


def test_onebit_lamb_accepts_bias_correction_and_ignores_it():
    cfg = {"optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 4}}, "threads": 1}
    on, _ = run(cfg, 8)
    cfg["optimizer"]["params"]["bias_correction"] = False
    off, _ = run(cfg, 8)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)
