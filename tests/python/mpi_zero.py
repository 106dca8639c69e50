"""Run under ``mpirun -np P``: ZeRO stage 1/2 on P ranks against stage-0
data parallelism (zero_runs.SCENARIOS). Every check is made on the ranks
themselves; a failing check aborts the run with its traceback. Phases
(``$DSOPT_TEST_PHASES``):

* equivalence: stage 1 and 2 equal stage 0 after every step (bit for bit
  with exact gradients or at most two ranks, else within fp32 rounding),
  the same step infos, identical parameters on every rank; LAMB's stage 0
  also equals its numpy reference (lamb_reference.py) bit for bit, Lion's
  its float64 reference (lion_reference.py) within fp32 rounding;
* resume: a ZeRO-2 run saved after 3 steps and loaded into a fresh
  optimizer continues bit-identically;
* save: writes the blobs of a ZeRO-2 run and of a stage-0 run after 3
  steps into the results folder (``<scenario>_<stage>_r<rank>.blob``);
* reshard: loads every blob of ``$DSOPT_ZERO_LOAD_FROM`` with
  load_state_dict_shards at this world size, into stage 2 (from stage-2 and
  from stage-0 blobs) and into stage 0 (from stage-2 blobs), and continues:
  bit-identical to the stage-0 run of the same old world size loaded with
  dsopt_state_load (replicated state loads as is) and continued here;
* memory: dsopt_memory_usage equals the accounting of the layout rule
  (AdamW, and LAMB with its direction and rebuilt blocks), and
  dsopt_state_memory_usage the masters and moments held;
* bad_blobs: missing, duplicated, misordered, corrupted, foreign and
  other-run blobs are rejected on every rank and change nothing."""

import dataclasses
import glob
import os
import sys

import numpy as np
from mpi4py import MPI

import dsopt
import zero_runs as zr
from lamb_reference import LambReference
from lion_reference import LionReference, lion_groups
from mpi_phases import main, out_path

MPI_WORLD = MPI.COMM_WORLD
SAVE_AFTER = 3
CONTINUE = 3
RESHARD_SCENARIOS = ["fp32", "mixed_dtypes", "fp16_dynamic", "lamb_mixed_dtypes", "lion_mixed_dtypes",
                     "sgd_mixed_dtypes"]
RESUME_SCENARIOS = ["fp32_random", "fp16_dynamic", "mixed_dtypes", "lamb_mixed_dtypes", "lamb_fp16_dynamic",
                    "lion_mixed_dtypes", "lion_fp16_dynamic", "sgd_mixed_dtypes"]


def bits(arrays):
    return [a.view(np.uint32 if a.dtype == np.float32 else np.uint16) for a in arrays]


def assert_same(a, b, what, exact=True):
    for i, (x, y) in enumerate(zip(a, b)):
        if exact:
            if not np.array_equal(bits([x])[0], bits([y])[0]):
                bad = np.flatnonzero(bits([x])[0] != bits([y])[0])
                raise AssertionError(f"{what}: tensor {i} differs at {bad[:8]} ({len(bad)} elements): "
                                     f"{x.ravel()[bad[:4]]} vs {y.ravel()[bad[:4]]}")
        else:  # within a rounding of the parameter's own dtype (bf16 travels as uint16 bits)
            values = [(a.astype(np.uint32) << 16).view(np.float32) if a.dtype == np.uint16 else a
                      for a in (x, y)]
            rtol = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 2e-3}.get(x.dtype, 1.6e-2)
            np.testing.assert_allclose(*(v.astype(np.float64) for v in values), rtol=rtol,
                                       atol=1e-6, err_msg=what)


def assert_replicated(params, what):
    digests = MPI_WORLD.allgather([p.tobytes() for p in params])
    for r, d in enumerate(digests):
        assert d == digests[0], f"{what}: rank {r}'s parameters differ from rank 0's"


def run(sc, stage, comm, rank, steps=None):
    opt, _ = zr.make(sc, stage, comm)
    history = []
    with opt:
        infos = zr.step_all(opt, sc, rank, 0, steps or sc.steps, history)
    return history, infos


def check_lamb_reference(sc, history, size):
    """Stage 0 of a LAMB scenario with exact gradients and a fixed loss
    scale against the numpy reference on `size` ranks."""
    ref = LambReference(zr.config(sc, 0), zr.initial_params(sc), size, group_of=sc.groups,
                        kinds=list(sc.kinds))
    for k, got in enumerate(history):
        ref.step([zr.gradients(sc, k, r, 1.0) for r in range(size)])
        assert_same(got, ref.params(), f"{sc.name} stage 0 step {k + 1} at P={size} against the reference")


def check_lion_reference(sc, history, size):
    """Stage 0 of a Lion scenario with exact gradients against the float64
    reference of the rank-averaged gradient on `size` ranks."""
    ref = LionReference(zr.initial_params(sc), lion_groups(zr.config(sc, 0)), sc.groups)
    for k, got in enumerate(history):
        grads = [zr.gradients(sc, k, r, 1.0) for r in range(size)]
        ref.step([np.mean([g[i] for g in grads], axis=0, dtype=np.float64).astype(np.float32)
                  for i in range(len(sc.sizes))])
        for i, (x, y) in enumerate(zip(got, ref.p)):
            np.testing.assert_allclose(x.astype(np.float64), y, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{sc.name} stage 0 step {k + 1} tensor {i} at P={size}")


def phase_equivalence(comm, rank, size):
    checked = 0
    for sc in zr.SCENARIOS:
        ref, ref_infos = run(sc, 0, comm, rank)
        if sc.opt_type == "Lamb" and sc.grads == "exact" and not sc.overflow:
            check_lamb_reference(sc, ref, size)
        if sc.opt_type == "Lion" and sc.grads == "exact" and set(sc.kinds) == {"fp32"}:
            check_lion_reference(sc, ref, size)
        exact = sc.grads == "exact" or size <= 2
        for stage in (1, 2):
            hist, infos = run(sc, stage, comm, rank)
            for k, (a, b) in enumerate(zip(hist, ref)):
                what = f"{sc.name} stage {stage} step {k + 1} at P={size}"
                # At P=3 the norm (clipping) sums doubles in another order.
                assert_same(a, b, what, exact and not (sc.name == "clipping" and size == 3))
                assert_replicated(a, what)
            for x, y in zip(infos, ref_infos):
                assert (x.skipped, x.step, x.loss_scale) == (y.skipped, y.step, y.loss_scale), \
                    f"{sc.name} stage {stage}: {x} vs {y}"
                assert x.grad_norm == y.grad_norm or \
                    abs(x.grad_norm - y.grad_norm) <= 1e-6 * abs(y.grad_norm), (x, y)
            if sc.overflow and sc.overflow[1] < size:
                assert infos[sc.overflow[0]].skipped and sum(i.skipped for i in infos) == 1
            checked += 1
    return checked


def save_blobs(sc, stage, comm, rank, steps=SAVE_AFTER):
    opt, _ = zr.make(sc, stage, comm)
    with opt:
        zr.step_all(opt, sc, rank, 0, steps)
        return opt.state_dict(), [p.copy() for p in zr.opt_params(opt)]


def continue_from(sc, stage, comm, rank, params, load):
    """A fresh optimizer over copies of ``params``, ``load(opt)``, then
    CONTINUE steps; the parameter history."""
    opt, _ = zr.make(sc, stage, comm, [p.copy() for p in params])
    history = []
    with opt:
        load(opt)
        zr.step_all(opt, sc, rank, SAVE_AFTER, CONTINUE, history)
    return history


def phase_resume(comm, rank, size):
    for sc in (zr.BY_NAME[name] for name in RESUME_SCENARIOS):
        for stage in (1, 2):
            whole, _ = run(sc, stage, comm, rank, SAVE_AFTER + CONTINUE)
            blob, params = save_blobs(sc, stage, comm, rank)
            # The caller restores its own fp32 parameters; dsopt its masters.
            resumed = continue_from(sc, stage, comm, rank, params, lambda o: o.load_state_dict(blob))
            for k, (a, b) in enumerate(zip(resumed, whole[SAVE_AFTER:])):
                assert_same(a, b, f"{sc.name} stage {stage} resumed, step {SAVE_AFTER + k + 1}")


def phase_save(comm, rank, size):
    for name in RESHARD_SCENARIOS:
        sc = zr.BY_NAME[name]
        for stage in (0, 2):
            blob, params = save_blobs(sc, stage, comm, rank)
            with open(out_path(f"{name}_{stage}_r{rank}.blob"), "wb") as f:
                f.write(blob)
            if rank == 0:
                np.savez(out_path(f"{name}_{stage}_params.npz"), *params)


def saved(folder, name, stage):
    files = sorted(glob.glob(os.path.join(folder, f"{name}_{stage}_r*.blob")),
                   key=lambda p: int(p.rsplit("_r", 1)[1].split(".")[0]))
    blobs = [open(p, "rb").read() for p in files]
    with np.load(os.path.join(folder, f"{name}_{stage}_params.npz")) as z:
        params = [z[f"arr_{i}"] for i in range(len(z.files))]
    return blobs, params


def phase_reshard(comm, rank, size):
    folder = os.environ["DSOPT_ZERO_LOAD_FROM"]
    for name in RESHARD_SCENARIOS:
        sc = zr.BY_NAME[name]
        zero_blobs, zero_params = saved(folder, name, 2)
        stage0_blobs, stage0_params = saved(folder, name, 0)
        assert_same(zero_params, stage0_params, f"{name}: saved parameters")
        # Reference: replicated stage-0 state, loaded as is at this size.
        ref = continue_from(sc, 0, comm, rank, stage0_params,
                            lambda o: o.load_state_dict(stage0_blobs[0]))
        cases = {"stage 2 -> stage 2": (2, zero_blobs), "stage 0 -> stage 2": (2, stage0_blobs),
                 "stage 2 -> stage 0": (0, zero_blobs), "stage 2 -> stage 1": (1, zero_blobs)}
        for what, (stage, blobs) in cases.items():
            got = continue_from(sc, stage, comm, rank, zero_params,
                                lambda o: o.load_state_dict_shards(blobs))
            for k, (a, b) in enumerate(zip(got, ref)):
                msg = f"{name} {what}, {len(zero_blobs)} -> {size} ranks, step {SAVE_AFTER + k + 1}"
                assert_same(a, b, msg)
                assert_replicated(a, msg)


def expect_error(fn, error, pattern, what):
    try:
        fn()
    except error as e:
        assert pattern in str(e), f"{what}: message {e!r} lacks {pattern!r}"
    else:
        raise AssertionError(f"{what}: no {error.__name__}")


def phase_bad_blobs(comm, rank, size):
    sc = zr.BY_NAME["mixed_dtypes"]
    blobs = MPI_WORLD.allgather(save_blobs(sc, 2, comm, rank)[0])
    # Same model and config, other initial values: another run.
    other_run = MPI_WORLD.allgather(save_blobs(dataclasses.replace(sc, seed=8), 2, comm, rank)[0])
    foreign = MPI_WORLD.allgather(save_blobs(zr.BY_NAME["tiny"], 2, comm, rank)[0])
    later = MPI_WORLD.allgather(save_blobs(sc, 2, comm, rank, SAVE_AFTER + 1)[0])
    corrupt = bytearray(blobs[-1])
    corrupt[len(corrupt) // 2] ^= 1
    cases = [
        (blobs[:-1] if size > 1 else [], "missing",
         dsopt.Mismatch if size > 1 else dsopt.InvalidArgument, ""),
        (blobs[:1] * size if size > 1 else [foreign[0]], "duplicated", dsopt.Mismatch, ""),
        (blobs[::-1] if size > 1 else foreign, "misordered", dsopt.Mismatch, ""),
        (blobs[:-1] + [bytes(corrupt)], "corrupted", dsopt.CorruptState, "checksum"),
        (foreign, "another model", dsopt.Mismatch, "parameters"),
        (blobs[:-1] + other_run[-1:] if size > 1 else foreign, "two runs", dsopt.Mismatch, ""),
        (blobs[:-1] + later[-1:] if size > 1 else foreign, "two steps", dsopt.Mismatch, ""),
    ]
    opt, _ = zr.make(sc, 2, comm)
    with opt:
        zr.step_all(opt, sc, rank, 0, 2)
        before = [p.copy() for p in zr.opt_params(opt)]
        state = opt.state_dict()
        for set_, what, error, pattern in cases:
            expect_error(lambda: opt.load_state_dict_shards(set_), error, pattern, what)
            assert_same(zr.opt_params(opt), before, f"parameters after a rejected {what} set")
            assert opt.state_dict() == state, f"state after a rejected {what} set"
        if size > 1:  # one rank's blob of another size: every rank fails, none hangs
            expect_error(lambda: opt.load_state_dict(blobs[(rank + 1) % size]), dsopt.Mismatch,
                         "", "another rank's blob")
        assert opt.state_dict() == state
        zr.step_all(opt, sc, rank, 2, 1)  # still steps


def phase_memory(comm, rank, size):
    for sc, expected in ((zr.MEMORY, zr.expected_host_bytes), (zr.LAMB_MEMORY, zr.expected_lamb_host_bytes)):
        want = expected(sc, size)
        for stage in (0, 1, 2):
            opt, _ = zr.make(sc, stage, comm)
            with opt:
                zr.step_all(opt, sc, rank, 0, 1)
                got, state = opt.memory_usage(), opt.state_memory_usage()
            assert got == {"host": want[stage], "device": 0}, (sc.name, stage, got, want)
            # the saved state: masters and moments of every element, or of the shard
            n = sum(sc.sizes)
            held = n if stage == 0 else n // size
            assert state == {"host": 12 * held, "device": 0}, (sc.name, stage, state)
    return zr.expected_host_bytes(zr.MEMORY, size)[2]


PHASES = {"memory": phase_memory, "equivalence": phase_equivalence, "resume": phase_resume, "save": phase_save,
          "reshard": phase_reshard, "bad_blobs": phase_bad_blobs}


if __name__ == "__main__":
    sys.exit(main(PHASES))
