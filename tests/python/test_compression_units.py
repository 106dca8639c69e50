"""Compression in the update's units (docs/optimizers/onebit-adam.md "Compression in the update's
units"): with the stabilized rule and more than one rank, 1-bit Adam
compresses clamp(m) / d, 0/1 Adam clamp(g) / d and its accumulator as it
is, 1-bit LAMB clamp(m) / d (and takes LAMB's trust ratio every step), d =
sqrt(v) rbc2 + eps. The choice travels in the state blob: a blob
written before it existed continues in the momentum's units, a blob's choice
wins over the config, and a bad value is rejected before anything changes.

Two ranks are threads on a callback communicator (test_callback_comm's
ThreadWorld); every result is compared bit for bit with the numpy references
(onebit_reference.py, zoadam_reference.py, onebit_lamb_reference.py), whose
`update_units` is the rule.
The scenarios of test_onebit_adam.py and test_zero_one_adam.py check the rule
itself at 2 and 4 ranks under mpirun."""

import struct

import numpy as np
import pytest

import dsopt
from dsopt_testing import assert_load_rejected
from onebit_lamb_reference import OneBitLambReference
from onebit_reference import OneBitAdamReference
from test_blob_compat import pack, sections
from test_callback_comm import ThreadWorld
from zoadam_reference import ZeroOneAdamReference

WORLD = 2
SIZES = (1000, 37, 4097)
UNITS_SECTION = {"OneBitAdam": "onebit.units", "ZeroOneAdam": "zoadam.units", "OneBitLamb": "lamb.units"}
REFERENCE = {"OneBitAdam": OneBitAdamReference, "ZeroOneAdam": ZeroOneAdamReference,
             "OneBitLamb": OneBitLambReference}
SAVE_AT, STEPS = 7, 12


def config(kind, **params):
    p = {"lr": 1e-2, "weight_decay": 0.01}
    if kind == "ZeroOneAdam":
        p.update(var_freeze_step=5, local_step_scaler=2, local_step_clipper=4)
    else:
        p.update(freeze_step=4)
    p.update(params)
    return {"optimizer": {"type": kind, "params": p}, "threads": 1}


def start():
    rng = np.random.default_rng(3)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def grads(rank, step):
    """Gradients whose scale differs by orders of magnitude between and
    inside tensors, as in a transformer's QKV projection."""
    rng = np.random.default_rng([rank, step, 11])
    out = []
    for n in SIZES:
        g = rng.standard_normal(n) * (1 + 0.2 * step)
        g[: n // 3] *= 1e-3
        out.append(g.astype(np.float32))
    return out


def library_run(cfg, first=0, blobs=None, params=None, save_at=None):
    """Both ranks from step `first` to STEPS, loading blobs[rank] first;
    returns per rank (parameters, {step: blob saved after it})."""
    world = ThreadWorld(WORLD)

    def body(rank):
        ps = [p.copy() for p in (params[rank] if params else start())]
        saved = {}
        with dsopt.Optimizer(cfg, ps, comm=world.communicator(rank)) as opt:
            if blobs is not None:
                opt.load_state_dict(blobs[rank])
            for k in range(first, STEPS):
                opt.step(grads(rank, k))
                if save_at == k + 1:
                    saved[k + 1] = (opt.state_dict(), [p.copy() for p in ps])
        return ps, saved

    return world.run(body)


def reference_run(kind, cfg, units_after_save):
    """The reference over STEPS with the default rule until SAVE_AT and
    `update_units = units_after_save` from then on; every rank's parameters
    (0/1 Adam's ranks differ between syncs)."""
    ref = REFERENCE[kind](cfg, start(), WORLD)
    assert ref.update_units
    for k in range(STEPS):
        if k == SAVE_AT:
            ref.update_units = units_after_save
            if kind == "OneBitLamb":  # the same choice picks 1-bit LAMB's trust ratio
                ref.trust_ratio = "larger" if units_after_save else "frozen"
        ref.step([grads(r, k) for r in range(WORLD)])
    return rank_params(ref)


def rank_params(ref):
    if isinstance(ref, ZeroOneAdamReference):
        return [ref.params(r) for r in range(WORLD)]
    return [ref.params()] * WORLD


def strip_or_set(blob, section, value):
    """The blob without `section` (value None), or with it set to int32 value."""
    prefix, parts = sections(blob)
    assert section in {n for n, _ in parts}
    if value is None:
        return pack(prefix, [(n, d) for n, d in parts if n != section])
    return pack(prefix, [(n, struct.pack("<i", value) if n == section else d) for n, d in parts])


@pytest.fixture(scope="module", params=list(REFERENCE))
def saved(request):
    """kind, the default run's final parameters per rank, and every rank's
    (blob, parameters) after SAVE_AT steps."""
    kind = request.param
    final = library_run(config(kind), save_at=SAVE_AT)
    return kind, [ps for ps, _ in final], [s[SAVE_AT] for _, s in final]


def test_the_default_rule_is_the_reference_in_update_units(saved):
    kind, final, _ = saved
    expected = reference_run(kind, config(kind), True)
    in_momentum_units = reference_run(kind, config(kind), False)
    for rank in range(WORLD):
        for a, e in zip(final[rank], expected[rank]):
            np.testing.assert_array_equal(a, e)
    assert any(not np.array_equal(a, e) for a, e in zip(final[0], in_momentum_units[0]))


def test_a_blob_written_before_the_choice_continues_in_momentum_units(saved):
    kind, _, at_save = saved
    old = [strip_or_set(blob, UNITS_SECTION[kind], None) for blob, _ in at_save]
    resumed = library_run(config(kind), first=SAVE_AT, blobs=old, params=[ps for _, ps in at_save])
    expected = reference_run(kind, config(kind), False)
    for (ps, _), e_rank in zip(resumed, expected):
        for a, e in zip(ps, e_rank):
            np.testing.assert_array_equal(a, e)


def test_the_blob_choice_wins_over_the_config(saved):
    """A blob in the update's units, loaded with "stabilize": false (whose
    own runs compress in the momentum's units), goes on in the update's
    units without the clamp."""
    kind, _, at_save = saved
    cfg = config(kind, stabilize=False)
    resumed = library_run(cfg, first=SAVE_AT, blobs=[b for b, _ in at_save], params=[ps for _, ps in at_save])
    ref = REFERENCE[kind](config(kind), start(), WORLD)
    for k in range(STEPS):
        if k == SAVE_AT:
            ref.stabilize = False
        ref.step([grads(r, k) for r in range(WORLD)])
    for (ps, _), e_rank in zip(resumed, rank_params(ref)):
        for a, e in zip(ps, e_rank):
            np.testing.assert_array_equal(a, e)


def test_an_invalid_choice_is_rejected_and_changes_nothing(saved):
    kind, _, at_save = saved
    bad = strip_or_set(at_save[0][0], UNITS_SECTION[kind], 2)
    params = start()
    with dsopt.Optimizer(config(kind), params) as opt:
        opt.step(grads(0, 0))
        assert_load_rejected(opt, params, bad, dsopt.CorruptState, "compression-units rule")


def test_one_rank_has_no_compression_to_change():
    """With one rank nothing is compressed: 1-bit Adam with the stabilized
    rule is the same with or without the units section in its blob."""
    cfg = config("OneBitAdam")
    ps = start()
    with dsopt.Optimizer(cfg, ps) as opt:
        for k in range(SAVE_AT):
            opt.step(grads(0, k))
        blob = opt.state_dict()
    ends = []
    for b in (blob, strip_or_set(blob, "onebit.units", None)):
        qs = [p.copy() for p in ps]
        with dsopt.Optimizer(cfg, qs) as opt:
            opt.load_state_dict(b)
            for k in range(SAVE_AT, STEPS):
                opt.step(grads(0, k))
        ends.append(qs)
    for a, e in zip(*ends):
        np.testing.assert_array_equal(a, e)
