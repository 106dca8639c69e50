"""Gradients handed over one parameter at a time (``Optimizer.grad_ready``,
then ``step()``) against gradients passed to ``step(grads)`` at once. Run
under ``mpirun -np P`` (every check is made on the ranks; a failing one
aborts the run with its traceback) and, at one rank, in process by
test_grad_ready_bindings.py. Phases (``$DSOPT_TEST_PHASES``):

* order: AdamW at ZeRO stage 0, 1 and 2 with reduce buckets of 64 elements
  (several buckets, tensors split across them): handing every gradient over
  in reverse order, in an order of each rank's own, through one scratch
  buffer reused for every parameter, or leaving some parameters out on
  some ranks, gives the parameters and step infos of ``step(grads)`` with
  the same gradients (zeros for those left out) bit for bit, every step;
* accumulation: ``"gradient_accumulation_steps": 3``, each parameter handed
  over three times per step, against a float64 AdamW on the mean over the
  ranks and micro-batches, within 1e-6 relative, at every stage;
* misuse: an index out of range, a wrong numel or dtype, a parameter handed
  over G+1 times and ``step(grads)`` while gradients are handed over raise
  ``dsopt.InvalidArgument`` on every rank and change nothing: the step then
  completes like a run without the mistakes, bit for bit."""

import sys

import numpy as np

import dsopt
from dsopt_testing import reference_for
from halfprec import bf16_bits_to_float, to_bf16_bits
from mpi_phases import main

# Odd sizes: 64-element buckets split most tensors, and the shards of P
# ranks cut through them too.
SIZES = (37, 100, 3, 129, 64, 1, 70)
GRAD_KINDS = ("fp32", "fp16", "fp32", "bf16", "fp32", "fp32", "fp16")
GROUPS = (0, 1, 0, 1, 0, 0, 1)
STEPS = 4
STAGES = (0, 1, 2)


def config(stage, accumulation=None):
    # eps near the gradients' scale: Adam's update then depends on that
    # scale (a sum of the micro-batches instead of their mean shows).
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01,
                                                       "betas": [0.8, 0.99], "eps": 1e-2}},
           "param_groups": [{}, {"lr": 0.02, "weight_decay": 0.0}],
           "report_grad_norm": True,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 64,
                                 "allgather_bucket_size": 48}}
    if accumulation is not None:
        cfg["gradient_accumulation_steps"] = accumulation
    return cfg


def initial_params():
    rng = np.random.default_rng([11, 1])
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def make(cfg, comm, params=None):
    params = initial_params() if params is None else params
    return dsopt.Optimizer(cfg, params, comm=comm, groups=list(GROUPS)), params


def gradient(step, rank, i, micro=0):
    """Parameter i's gradient on ``rank`` (for the binding: fp16 as numpy
    float16, bf16 as ``dsopt.bf16`` of its bits)."""
    rng = np.random.default_rng([5, step, rank, micro, i])
    g = (rng.standard_normal(SIZES[i]) * (0.5 + i % 3)).astype(np.float32)
    kind = GRAD_KINDS[i]
    if kind == "fp16":
        return g.astype(np.float16)
    if kind == "bf16":
        return dsopt.bf16(to_bf16_bits(g))
    return g


def values(grad):
    """The float64 values of a gradient as ``gradient`` returns it."""
    if isinstance(grad, dsopt.bf16):
        return bf16_bits_to_float(grad.array).astype(np.float64)
    return np.asarray(grad, dtype=np.float64)


def gradients(step, rank, micro=0):
    return [gradient(step, rank, i, micro) for i in range(len(SIZES))]


def bits(a):
    return a.view(np.uint32)


def assert_same(got, want, what):
    for i, (x, y) in enumerate(zip(got, want)):
        if not np.array_equal(bits(x), bits(y)):
            bad = np.flatnonzero(bits(x) != bits(y))
            raise AssertionError(f"{what}: parameter {i} differs at {bad[:8]} ({len(bad)} of "
                                 f"{x.size}): {x[bad[:4]]} vs {y[bad[:4]]}")


def assert_same_info(got, want, what):
    fields = ("skipped", "step", "loss_scale", "grad_norm", "consecutive_skips", "phase")
    for f in fields:
        assert getattr(got, f) == getattr(want, f), f"{what}: info.{f} {got} vs {want}"


# ---- handing over -------------------------------------------------------------

class Scratch:
    """One buffer per dtype that every parameter's gradient is copied into
    before it is handed over: dsopt must have read it by then."""

    def __init__(self):
        n = max(SIZES)
        self.f32 = np.full(n, np.nan, np.float32)
        self.f16 = np.full(n, np.nan, np.float16)
        self.bf16 = np.full(n, 0x7FC0, np.uint16)

    def __call__(self, grad):
        if isinstance(grad, dsopt.bf16):
            out = self.bf16[:grad.array.size]
            out[...] = grad.array
            return dsopt.bf16(out)
        out = (self.f16 if grad.dtype == np.float16 else self.f32)[:grad.size]
        out[...] = grad
        return out

    def spoil(self):
        self.f32.fill(np.nan)
        self.f16.fill(np.nan)
        self.bf16.fill(0x7FC0)


def order_of(variant, rank, step):
    n = len(SIZES)
    if variant in ("reverse", "missing"):
        return list(range(n - 1, -1, -1))
    return [int(i) for i in np.random.default_rng([17, rank, step]).permutation(n)]


def left_out(variant, rank, i):
    """Parameters a rank does not hand over (variant "missing")."""
    return variant == "missing" and (i + rank) % 3 == 0


def run_at_once(stage, comm, rank, variant="reverse"):
    opt, params = make(config(stage), comm)
    history, infos = [], []
    with opt:
        for step in range(STEPS):
            grads = gradients(step, rank)
            # Left out: absent (None), as a parameter no rank hands over is;
            # one some ranks hand over gets zeros from the others.
            grads = [None if left_out(variant, rank, i) else g for i, g in enumerate(grads)]
            infos.append(opt.step(grads))
            history.append([p.copy() for p in params])
    return history, infos


def run_handed_over(stage, comm, rank, variant):
    opt, params = make(config(stage), comm)
    scratch = Scratch() if variant == "scratch" else None
    history, infos = [], []
    with opt:
        for step in range(STEPS):
            grads = gradients(step, rank)
            for i in order_of(variant, rank, step):
                if left_out(variant, rank, i):
                    continue
                opt.grad_ready(i, scratch(grads[i]) if scratch else grads[i])
            if scratch:
                scratch.spoil()
            infos.append(opt.step())
            history.append([p.copy() for p in params])
    return history, infos


def phase_order(comm, rank, size):
    checked = 0
    for stage in STAGES:
        references = {}
        for variant in ("reverse", "random", "scratch", "missing"):
            key = "missing" if variant == "missing" else "all"
            if key not in references:
                references[key] = run_at_once(stage, comm, rank, variant)
            want, want_infos = references[key]
            got, infos = run_handed_over(stage, comm, rank, variant)
            for k in range(STEPS):
                what = f"stage {stage}, {variant} order, step {k + 1}, P={size}"
                assert_same(got[k], want[k], what)
                assert_same_info(infos[k], want_infos[k], what)
                assert not infos[k].skipped and infos[k].step == k + 1, (what, infos[k])
            checked += 1
    return checked


# ---- gradient accumulation ------------------------------------------------------

ACCUMULATION = 3


def mean_gradients(step, size):
    """The mean over ranks and micro-batches, in float64."""
    total = [np.zeros(n) for n in SIZES]
    for r in range(size):
        for micro in range(ACCUMULATION):
            for i, g in enumerate(gradients(step, r, micro)):
                total[i] += values(g)
    return [t / (size * ACCUMULATION) for t in total]


def phase_accumulation(comm, rank, size):
    for stage in STAGES:
        cfg = config(stage, ACCUMULATION)
        opt, params = make(cfg, comm)
        ref = reference_for(cfg, initial_params(), GROUPS)
        with opt:
            for step in range(STEPS):
                for micro in range(ACCUMULATION):
                    grads = gradients(step, rank, micro)
                    for i in order_of("random", rank, step * ACCUMULATION + micro):
                        opt.grad_ready(i, grads[i])
                info = opt.step()
                assert not info.skipped and info.step == step + 1, info
                ref.step(mean_gradients(step, size))
        for i, p in enumerate(params):
            np.testing.assert_allclose(p.astype(np.float64), ref.p[i], rtol=1e-6, atol=1e-9,
                                       err_msg=f"stage {stage}, P={size}: parameter {i}")
        moved = max(np.max(np.abs(p - q)) for p, q in zip(params, initial_params()))
        assert moved > 1e-3, f"stage {stage}: parameters did not move ({moved})"
    return len(STAGES)


# ---- misuse ---------------------------------------------------------------------

def expect_invalid(fn, pattern, what, error=dsopt.InvalidArgument):
    try:
        fn()
    except error as e:
        assert pattern.lower() in str(e).lower(), f"{what}: message {e!r} lacks {pattern!r}"
    else:
        raise AssertionError(f"{what}: no {error.__name__}")


def run_clean(stage, comm, rank):
    """Two steps of G=2 accumulation in parameter order, no mistakes."""
    opt, params = make(config(stage, 2), comm)
    with opt:
        for step in range(2):
            for micro in range(2):
                for i, g in enumerate(gradients(step, rank, micro)):
                    opt.grad_ready(i, g)
            opt.step()
    return params


def bad_calls(opt, grads):
    """Hand-overs the binding or the library rejects, changing nothing."""
    n = len(SIZES)
    g = grads[0]
    expect_invalid(lambda: opt.grad_ready(-1, g), "", "index -1")
    expect_invalid(lambda: opt.grad_ready(n, g), "", "index == num_params")
    expect_invalid(lambda: opt.grad_ready(2 ** 70, g), "int64", "index beyond int64")
    expect_invalid(lambda: opt.grad_ready("0", g), "int", "index of the wrong type",
                   dsopt.InvalidArgumentType)
    expect_invalid(lambda: opt.grad_ready(0, grads[1]), "", "numel of parameter 1")
    expect_invalid(lambda: opt.grad_ready(0, np.zeros(SIZES[0], np.int32)), "dtype",
                   "int32 gradient", dsopt.InvalidArgumentType)
    expect_invalid(lambda: opt.grad_ready(0, np.zeros(SIZES[0], np.uint16)), "bf16",
                   "untagged uint16 gradient", dsopt.InvalidArgumentType)
    expect_invalid(lambda: opt.grad_ready(0, np.zeros(2 * SIZES[0], np.float32)[::2]),
                   "contiguous", "strided gradient")
    expect_invalid(lambda: opt.grad_ready(0, [0.0] * SIZES[0]), "numpy array",
                   "a list", dsopt.InvalidArgumentType)


def phase_misuse(comm, rank, size):
    n = len(SIZES)
    for stage in STAGES:
        opt, params = make(config(stage, 2), comm)
        with opt:
            for step in range(2):
                grads = [gradients(step, rank, micro) for micro in range(2)]
                bad_calls(opt, grads[0])  # nothing handed over yet: nothing starts
                opt.grad_ready(0, grads[0][0])
                bad_calls(opt, grads[0])  # in the middle of a micro-batch
                expect_invalid(lambda: opt.step(grads[0]), "", "step(grads) while handed over")
                for i in range(1, n):
                    opt.grad_ready(i, grads[0][i])
                for i in range(n):
                    opt.grad_ready(i, grads[1][i])
                # Every parameter has had its G = 2 gradients.
                expect_invalid(lambda: opt.grad_ready(0, grads[1][0]), "", "a third hand-over")
                expect_invalid(lambda: opt.grad_ready(n - 1, grads[1][n - 1]), "",
                               "a third hand-over of the last parameter")
                bad_calls(opt, grads[1])
                expect_invalid(lambda: opt.step(grads[1]), "", "step(grads) with all handed over")
                info = opt.step()
                assert info.step == step + 1 and not info.skipped, info
        assert_same(params, run_clean(stage, comm, rank), f"stage {stage}: after the mistakes")
    return len(STAGES)


PHASES = {"order": phase_order, "accumulation": phase_accumulation, "misuse": phase_misuse}


if __name__ == "__main__":
    sys.exit(main(PHASES))
