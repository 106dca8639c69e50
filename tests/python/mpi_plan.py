"""Worker of test_plan.py, under ``mpirun -np P`` (P = 1..4): runs every
configuration of the planner's default table (every registered algorithm)
and a few more of other algorithms for a few steps on small models of odd
tensor sizes and compares, on every rank, ``info.bytes_sent`` of every step
and ``memory_usage()`` / ``state_memory_usage()`` to dsopt.plan's
prediction, exactly. Writes ``rank<r>.json`` into $DSOPT_TEST_RESULTS:
{"checks": count, "mismatches": [...]}."""

import dataclasses
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import dsopt
from halfprec import to_bf16_bits
from dsopt.plan import bytes as pbytes
from dsopt.plan.configs import Config, Settings, all_configs
from dsopt.plan.memory import memory
from dsopt.plan.model import Model

W = MPI.COMM_WORLD
P, RANK = W.size, W.rank

# Beyond the default table: other algorithms on compressed ZeRO and with
# gradients handed over.
EXTRA = [Config("Lion", "int4", "int8", path="czero"), Config("Lamb", "sign", "bf16", path="czero"),
         Config("Lamb", overlap=True, path="zero2"), Config("Lion", overlap=True)]

# (model, settings, steps, which configurations: None for all)
SETTINGS = Settings(reduce_bucket_size=400, allgather_bucket_size=300, freeze_step=3, var_freeze_step=4,
                    var_update_scaler=2, local_step_scaler=2, local_step_clipper=4,
                    gradient_block_size=32, parameter_block_size=16)
CASES = [
    (Model((1001, 437, 2, 77), "fp32"), SETTINGS, 9, None),
    (Model((3, 2050, 129, 1), "bf16"), dataclasses.replace(SETTINGS, reduce_bucket_size=5e8.__int__(),
                                                          allgather_bucket_size=5e8.__int__()), 6, None),
    (Model((1001, 437, 2, 77), "fp16"), dataclasses.replace(SETTINGS, reduce_bucket_size=96,
                                                           gradient_block_size=64), 5, None),
    # Large enough that MPI's compressed allreduce runs in several pieces.
    (Model((1_100_003, 70_001), "fp32"), SETTINGS, 5, lambda cfg: cfg.onebit),
]


def as_params(model, rng):
    out = []
    for n in model.sizes:
        x = (rng.standard_normal(n) * 0.1).astype(np.float32)
        out.append(x if model.dtype == "fp32" else dsopt.bf16(to_bf16_bits(x)) if model.dtype == "bf16" else x.astype(np.float16))
    return out


def grads(model, step, rank):
    rng = np.random.default_rng([step, rank])
    dt = np.float32 if model.dtype == "fp32" else np.float16 if model.dtype == "fp16" else None
    out = []
    for n in model.sizes:
        g = (rng.standard_normal(n) * 1e-2).astype(np.float32)
        out.append(g if dt is np.float32 else g.astype(np.float16) if dt is np.float16 else dsopt.bf16(to_bf16_bits(g)))
    return out


def sequential_comm():
    """mpi4py behind dsopt's callbacks, without concurrent calls: reductions
    of handed-over gradients run inside the hand-over calls (and the 1-bit
    compressed allreduce in one piece)."""
    ops = {"sum": MPI.SUM, "max": MPI.MAX}

    def allreduce(send, recv, op):
        W.Allreduce(MPI.IN_PLACE if send is recv else send, recv, op=ops[op])

    return dsopt.Communicator.from_callbacks(
        RANK, P, allreduce=allreduce,
        reduce_scatter=lambda send, recv, op: W.Reduce_scatter_block(send, recv, op=ops[op]),
        allgather=lambda send, recv: W.Allgather(send, recv),
        alltoall=lambda send, recv: W.Alltoall(send, recv))


def expected_memory(cfg, want, settings, k):
    """(memory_usage, state_memory_usage or None where not checked) after
    update k (1-based) of the planner's `want` (memory.Memory): 1-bit
    Adam/LAMB hold the warmup's until the compression stage begins, and
    their state is not compared then."""
    warm = cfg.info.schedule == "freeze" and k < settings.freeze_step - 1
    return (want.warmup, None) if warm else (want.total, want.state)


def run_case(comms, model, settings, steps, kinds, mismatches):
    checks = 0
    for cfg, (comm, concurrent) in [(c, x) for c in all_configs() + EXTRA for x in comms]:
        if kinds and not kinds(cfg):
            continue
        params = as_params(model, np.random.default_rng(7))
        name = f"{cfg.name} {model.dtype} {model.sizes} P={P} rank {RANK} {'mpi' if concurrent else 'callbacks'}"
        want_mem = memory(cfg, model, P, settings, rank=RANK, overlapping_comm=concurrent,
                          concurrent_comm=concurrent)
        # Overlap on a concurrent communicator: the extra buffers are a bound.
        least = memory(cfg, model, P, settings, rank=RANK, overlapping_comm=concurrent, concurrent_comm=False)
        zo_kinds = pbytes.zoadam_phases(settings, steps)
        with dsopt.Optimizer(cfg.dsopt_config(model, settings), params, comm=comm) as opt:
            for k in range(1, steps + 1):
                g = grads(model, k, RANK)
                if cfg.overlap:
                    for i in reversed(range(len(g))):
                        opt.grad_ready(i, g[i])
                    info = opt.step(None)
                else:
                    info = opt.step(g)
                if info.skipped:
                    mismatches.append(f"{name}: step {k} skipped")
                    continue
                want = pbytes.per_step_bytes(cfg, model, P, settings, k, zo_kinds[k - 1])
                checks += 1
                if info.bytes_sent != want:
                    mismatches.append(f"{name}: step {k} (phase {info.phase}) bytes_sent {info.bytes_sent}, "
                                      f"planner {want}")
                got = opt.memory_usage()["host"], opt.state_memory_usage()["host"]
                exp = expected_memory(cfg, want_mem, settings, k)
                checks += 1
                if concurrent and cfg.overlap and cfg.zero and least.total <= got[0] <= exp[0]:
                    continue
                if got[0] != exp[0] or (exp[1] is not None and got[1] != exp[1]):
                    mismatches.append(f"{name}: after step {k} memory_usage {got[0]} state {got[1]}, "
                                      f"planner {exp[0]} state {exp[1]}")
    return checks


def main():
    comms = [(dsopt.Communicator.from_mpi4py(W), True), (sequential_comm(), False)]
    mismatches, checks = [], 0
    for model, settings, steps, kinds in CASES:
        checks += run_case(comms, model, settings, steps, kinds, mismatches)
    out = os.environ.get("DSOPT_TEST_RESULTS")
    text = json.dumps({"checks": checks, "mismatches": mismatches})
    if out:
        with open(os.path.join(out, f"rank{RANK}.json"), "w") as f:
            f.write(text)
    else:
        print(f"rank {RANK}: {checks} checks, {len(mismatches)} mismatches", *mismatches[:40], sep="\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
