"""A step whose communication fails is all-or-nothing, or the optimizer says
it is not (docs/robustness.md "A failed collective"): for every optimizer and
kind of step (warmup, compressed, local, sync; ZeRO-1/2 with and without
clipping and fp16) and every collective k of that step, one rank fails its
k-th collective and every rank's step returns DSOPT_ECOMM. Then on every rank
either the parameters and the state blob are byte-identical to those before
the step (atomic), or every later call that would use or save the state
(step, grad_ready, state_dict, state_view, load_state_dict) returns
DSOPT_ECOMM saying the state is inconsistent (failed mark). Either way a
fresh world of optimizers that loads the blobs saved before the step
continues bit-identically with an uninterrupted run.

Ranks are threads on a callback communicator (test_callback_comm's
ThreadWorld), at 2 and 4 ranks. Run with -s to see, per kind of step, which
failure points are atomic."""

import numpy as np
import pytest

import dsopt
from test_callback_comm import ThreadWorld

SIZES = (1000, 37, 301)
STEPS = 12  # the reference run: long enough for every phase of every scenario


def adam(kind="AdamW", **params):
    return {"optimizer": {"type": kind, "params": dict({"lr": 1e-2, "weight_decay": 0.01}, **params)},
            "threads": 1}


def zero(stage, **top):
    cfg = adam()
    cfg["zero_optimization"] = {"stage": stage, "reduce_bucket_size": 400, "allgather_bucket_size": 400}
    cfg.update(top)
    return cfg


FP16 = {"fp16": {"enabled": True, "initial_scale_power": 8}}
SCENARIOS = {
    "adamw": (adam(), "fp32"),
    "adamw_fp16_clipping": (dict(adam(), gradient_clipping=0.5, **FP16), "fp16"),
    "onebit_adam": (adam("OneBitAdam", freeze_step=3), "fp32"),
    "onebit_lamb": (adam("OneBitLamb", freeze_step=3), "fp32"),
    "zero_one_adam": (adam("ZeroOneAdam", var_freeze_step=5, var_update_scaler=1, local_step_scaler=4,
                           local_step_clipper=4),
                      "fp32"),
    "zero1": (zero(1), "fp32"),
    "zero2": (zero(2), "fp32"),
    "zero2_clipping": (zero(2, gradient_clipping=0.5), "fp32"),
    "zero2_fp16": (zero(2, **FP16), "fp16"),
    "lamb": (adam("Lamb"), "fp32"),
    "lamb_zero2": (dict(zero(2), optimizer=adam("Lamb")["optimizer"]), "fp32"),
    # Compressed ZeRO: the residual's update is part of the step.
    "zero2_compressed": (dict(zero(2), zero_optimization=dict(
        zero(2)["zero_optimization"], compression={"gradients": "int4", "parameters": "int8",
                                                   "gradient_block_size": 32})), "fp32"),
    "zero1_compressed_fp16": (dict(zero(1, **FP16), zero_optimization=dict(
        zero(1)["zero_optimization"], compression={"gradients": "sign", "gradient_block_size": 64})), "fp16"),
}
PHASES = {dsopt.lib.DSOPT_PHASE_FULL: "full", dsopt.lib.DSOPT_PHASE_COMPRESSED: "compressed",
          dsopt.lib.DSOPT_PHASE_LOCAL: "local", dsopt.lib.DSOPT_PHASE_SYNC: "sync"}


class FailingWorld(ThreadWorld):
    """A ThreadWorld in which rank `fail_at[0]` fails its collective number
    `fail_at[1]` (counted from 0 over the whole run): it joins the
    collective's first barrier, so that every rank is inside it, then
    breaks the barrier and raises; the others' callbacks raise
    BrokenBarrierError."""

    fail_at = None

    def _exchange(self, rank, name, send, recv):
        if self.fail_at == (rank, len(self.calls[rank])):
            self.calls[rank].append((name, send.dtype, len(send)))
            self.slots[rank] = np.array(send)
            self.barrier.wait()
            self.barrier.abort()
            raise RuntimeError(f"injected failure of collective {self.fail_at[1]} on rank {rank}")
        return super()._exchange(rank, name, send, recv)


def start(dtype):
    rng = np.random.default_rng(5)
    return [rng.standard_normal(n).astype(np.float16 if dtype == "fp16" else np.float32) for n in SIZES]


def grads(rank, step, dtype):
    rng = np.random.default_rng([rank, step, 17])
    out = []
    for n in SIZES:
        g = rng.standard_normal(n) * (1 + 0.3 * step)
        g[: n // 4] *= 1e-2
        out.append(g.astype(np.float16 if dtype == "fp16" else np.float32))
    return out


def reference(name, size):
    """An uninterrupted run: per step, the collectives of rank 0, the phase,
    and every rank's parameters after it."""
    config, dtype = SCENARIOS[name]
    world = ThreadWorld(size)

    def rank_main(rank):
        params = start(dtype)
        out = []
        with world.communicator(rank) as comm, dsopt.Optimizer(config, params, comm=comm) as opt:
            for step in range(STEPS):
                before = len(world.calls[rank])
                info = opt.step(grads(rank, step, dtype))
                out.append((len(world.calls[rank]) - before, info.phase, [p.copy() for p in params]))
        return out

    return world.run(rank_main)


def steps_of_each_phase(runs):
    """Per phase, its first step (the first steps also compare the ranks'
    gradients: more collectives) and its last one."""
    chosen = {}
    for step, (_, phase, _) in enumerate(runs[0]):
        if phase in PHASES:
            chosen.setdefault(PHASES[phase], []).append(step)
    return {phase: sorted({steps[0], steps[-1]}) for phase, steps in chosen.items()}


def assert_refuses_everything(opt, rank, dtype):
    """Every call that would use or save the state fails with the mark."""
    calls = {"step": lambda: opt.step(grads(rank, 99, dtype)),
             "grad_ready": lambda: opt.grad_ready(0, grads(rank, 99, dtype)[0]),
             "state_dict": opt.state_dict,
             "state_view": lambda: opt.state_view(0, "exp_avg"),
             "load_state_dict": lambda: opt.load_state_dict(b"\0" * 64)}
    for call, fn in calls.items():
        with pytest.raises(dsopt.CommError, match="state is inconsistent") as error:
            fn()
        assert error.value.status == dsopt.lib.DSOPT_ECOMM, call
        assert "load the last state saved before the failure" in str(error.value), call


def fail_one_collective(name, size, step, k):
    """Steps 0..step-1, then step `step` with rank size-1's collective k of
    that step failing. Returns per rank ("atomic" | "failed", the checkpoint
before the step: its blob and the parameters)."""
    config, dtype = SCENARIOS[name]
    world = FailingWorld(size)
    failing = size - 1

    def rank_main(rank):
        params = start(dtype)
        with world.communicator(rank) as comm, dsopt.Optimizer(config, params, comm=comm) as opt:
            for s in range(step):
                opt.step(grads(rank, s, dtype))
            blob = opt.state_dict()
            before = [p.copy() for p in params]
            world.sync.wait()
            if rank == failing:
                world.fail_at = (failing, len(world.calls[failing]) + k - 1)
            world.sync.wait()
            with pytest.raises(dsopt.CommError) as error:
                opt.step(grads(rank, step, dtype))
            assert error.value.status == dsopt.lib.DSOPT_ECOMM
            try:
                after = opt.state_dict()
            except dsopt.CommError:
                assert_refuses_everything(opt, rank, dtype)
                return "failed", (blob, before)
            assert after == blob, f"rank {rank}: the state changed, and the optimizer is not marked"
            for p, b in zip(params, before):
                assert p.tobytes() == b.tobytes(), f"rank {rank}: a parameter changed"
            return "atomic", (blob, before)

    return world.run(rank_main)


def resume(name, size, step, checkpoints, expected):
    """Fresh communicators and optimizers take the parameters and load the
    blobs saved before `step`, and run to the end: parameters bit-identical
    to the uninterrupted run."""
    config, dtype = SCENARIOS[name]
    world = ThreadWorld(size)

    def rank_main(rank):
        blob, saved = checkpoints[rank]
        params = [p.copy() for p in saved]
        with world.communicator(rank) as comm, dsopt.Optimizer(config, params, comm=comm) as opt:
            opt.load_state_dict(blob)
            for s in range(step, STEPS):
                opt.step(grads(rank, s, dtype))
        for p, e in zip(params, expected[rank][STEPS - 1][2]):
            assert p.tobytes() == e.tobytes(), f"rank {rank}: the resumed run differs"

    world.run(rank_main)


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_failure_point_is_atomic_or_marks_the_optimizer(name, size):
    runs = reference(name, size)
    for rank in range(size):  # the same collectives on every rank
        assert [r[:2] for r in runs[rank]] == [r[:2] for r in runs[0]]
    phases = steps_of_each_phase(runs)
    expected_phases = {"zero_one_adam": {"full", "compressed", "local", "sync"},
                       "onebit_adam": {"full", "compressed"}, "onebit_lamb": {"full", "compressed"}}
    assert set(phases) == expected_phases.get(name, {"full"}), phases
    report = []
    for phase, step in ((p, s) for p, steps in phases.items() for s in steps):
        collectives = runs[0][step][0]
        assert collectives >= 1
        outcome = []
        for k in range(1, collectives + 1):
            results = fail_one_collective(name, size, step, k)
            kinds = {kind for kind, _ in results}
            assert len(kinds) == 1, f"collective {k}: ranks disagree: {results}"
            outcome.append(kinds.pop())
            resume(name, size, step, [checkpoint for _, checkpoint in results], runs)
        # The handshake that starts every step changes nothing.
        assert outcome[0] == "atomic", outcome
        if name.startswith("adamw") or name == "lamb":  # stage 0: every collective precedes the update
            assert set(outcome) == {"atomic"}, outcome
        report.append(f"{phase} step {step}: {outcome.count('atomic')}/{collectives} atomic "
                      f"({' '.join('a' if o == 'atomic' else 'F' for o in outcome)})")
    print(f"\n{name} at {size} ranks: " + "; ".join(report))
