"""Run under ``mpirun -np 2``: rules that need two ranks. For each phase
that passes, writes ``<phase> OK <result>`` to ``$DSOPT_TEST_RESULTS/rank<r>.txt``
(and prints it); aborts the job on the first failed check."""

import hashlib
import os
import sys
import traceback

import numpy as np

import dsopt
from adam_reference import LossScalerReference
from dsopt_testing import adam_config, assert_fp32_close, reference_for
from mpi_world import world

SIZES = [7, 33, 1000]
STEPS = 20


def local_grads(seed, k, rank, scale):
    rng = np.random.default_rng([seed, k, rank])
    return [(rng.standard_normal(n) * scale).astype(np.float32) for n in SIZES]


def digest(params):
    h = hashlib.sha256()
    for p in params:
        h.update(p.tobytes())
    return h.hexdigest()[:16]


def nonfinite_on_one_rank_skips_everywhere(comm, rank, size):
    """Rank (k % 2) alone gets an Inf/NaN at some steps: every rank skips."""
    poisoned = {3: (1, np.inf), 8: (1, np.nan), 9: (0, -np.inf), 15: (0, np.nan)}
    config = adam_config("AdamW", lr=1e-2, weight_decay=0.05)
    config["fp16"] = {"enabled": True, "initial_scale_power": 6, "loss_scale_window": 4}
    scaler = LossScalerReference(initial_scale_power=6, window=4)
    params = [np.random.default_rng(11).standard_normal(n).astype(np.float32) for n in SIZES]
    ref = reference_for(config, params)
    applied = 0
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for k in range(STEPS):
            scale = opt.loss_scale
            all_true = [local_grads(5, k, r, 1.0) for r in range(size)]
            grads = [(g * np.float32(scale)).astype(np.float32) for g in all_true[rank]]
            if k in poisoned and poisoned[k][0] == rank:
                grads[k % len(SIZES)][2] = poisoned[k][1]
            before = [p.copy() for p in params]
            info = opt.step(grads)
            overflow = k in poisoned
            assert info.skipped == overflow, f"step {k}: skipped={info.skipped}"
            assert info.loss_scale == scaler.update(overflow), f"step {k}"
            if overflow:
                assert all(np.array_equal(p, b) for p, b in zip(params, before)), f"step {k}"
            else:
                applied += 1
                mean = [sum(g[i].astype(np.float64) for g in all_true) / size
                        for i in range(len(SIZES))]
                ref.step(mean)
            assert info.step == applied, f"step {k}"
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i}")
    return digest(params)


def ranks_disagreeing_on_config_all_fail(comm, rank, size):
    params = [np.ones(n, np.float32) for n in SIZES]
    config = adam_config("AdamW", lr=1e-3 * (1 + rank))
    try:
        dsopt.Optimizer(config, params, comm=comm)
    except dsopt.Mismatch as exc:
        return "Mismatch " + str(exc).splitlines()[0][:80]
    raise AssertionError("dsopt_create accepted configs that differ between ranks")


def ranks_disagreeing_on_shapes_all_fail(comm, rank, size):
    params = [np.ones(n + rank, np.float32) for n in SIZES]
    try:
        dsopt.Optimizer(adam_config("AdamW"), params, comm=comm)
    except dsopt.Mismatch:
        return "Mismatch"
    raise AssertionError("dsopt_create accepted shapes that differ between ranks")


def bad_gradient_on_one_rank_fails_everywhere(comm, rank, size):
    params = [np.random.default_rng(3).standard_normal(n).astype(np.float32) for n in SIZES]
    with dsopt.Optimizer(adam_config("AdamW"), params, comm=comm) as opt:
        opt.step(local_grads(1, 0, rank, 1.0))
        before = [p.copy() for p in params]
        blob = opt.state_dict()
        grads = local_grads(1, 1, rank, 1.0)
        if rank == 1:
            grads[0] = np.ones(SIZES[0] + 1, np.float32)
        try:
            opt.step(grads)
        except (dsopt.InvalidArgument, dsopt.Mismatch) as exc:
            # rank 1 its own error, rank 0 "another rank failed" naming it
            assert isinstance(exc, dsopt.InvalidArgument if rank == 1 else dsopt.Mismatch), exc
            if rank == 0:
                assert "rank 1" in str(exc), f"rank 0's message does not name rank 1: {exc}"
        else:
            raise AssertionError("a step with a bad gradient on rank 1 succeeded")
        assert all(np.array_equal(p, b) for p, b in zip(params, before))
        assert opt.state_dict() == blob
        opt.step(local_grads(1, 2, rank, 1.0))
    return digest(params)


RESHARD_CONFIG = {
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.05}},
    "fp16": {"enabled": True, "initial_scale_power": 10, "loss_scale_window": 3},
}


def continue_with_shared_grads(opt, steps=3):
    """Steps whose gradients are equal on every rank: the average is exact,
    so any world size gives the same bits."""
    for k in range(steps):
        rng = np.random.default_rng([99, k])
        opt.step([(rng.standard_normal(n) * opt.loss_scale).astype(np.float32) for n in SIZES])


def blob_saved_at_two_ranks_loads_at_one(comm, rank, size):
    """Rank 0 saves its blob (fp16 params, masters, scaler) for the pytest
    process to load into a one-rank optimizer and continue identically."""
    params = [np.random.default_rng(21).standard_normal(n).astype(np.float16) for n in SIZES]
    with dsopt.Optimizer(RESHARD_CONFIG, params, comm=comm) as opt:
        for k in range(4):
            opt.step(local_grads(8, k, rank, opt.loss_scale))
        blob = opt.state_dict()
        continue_with_shared_grads(opt)
    if rank == 0:
        out_dir = os.environ.get("DSOPT_TEST_RESULTS", ".")
        with open(os.path.join(out_dir, "p2_blob.bin"), "wb") as f:
            f.write(blob)
        np.savez(os.path.join(out_dir, "p2_after.npz"), *params)
    return digest(params)


PHASES = [
    nonfinite_on_one_rank_skips_everywhere,
    ranks_disagreeing_on_config_all_fail,
    ranks_disagreeing_on_shapes_all_fail,
    bad_gradient_on_one_rank_fails_everywhere,
    blob_saved_at_two_ranks_loads_at_one,
]


def main():
    comm, rank, size, finalize, abort, how = world()
    if size != 2:
        print(f"needs 2 ranks, got {size}", flush=True)
        abort(2)
    out_dir = os.environ.get("DSOPT_TEST_RESULTS", ".")
    results = open(os.path.join(out_dir, f"rank{rank}.txt"), "w")
    results.write(f"MPI via {how}\n")
    for phase in PHASES:
        try:
            result = phase(comm, rank, size)
        except BaseException:
            traceback.print_exc()
            print(f"RANK {rank} {phase.__name__} FAILED", flush=True)
            sys.stdout.flush()
            abort(1)
            return 1
        print(f"RANK {rank} {phase.__name__} OK {result}", flush=True)
        results.write(f"{phase.__name__} OK {result}\n")
        results.flush()
    results.close()
    comm.close()
    finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
