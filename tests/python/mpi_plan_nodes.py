"""Worker of test_plan.py under ``mpirun -np P`` (P = 4 or 6): the
planner's bytes per step, sent and across nodes (``dsopt.plan.bytes``
with a Topology), against the library's ``info.bytes_sent`` and
``info.bytes_inter_node`` of every step, exactly, on declared nodes of R
ranks (every R that divides P but 1 and P), the compressed configurations
(the 1-bit family, compressed ZeRO) in both forms and an uncompressed
one. Writes ``rank<r>.json``: {"checks": count, "mismatches": [...]}."""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import dsopt
from dsopt.plan import bytes as pbytes
from dsopt.plan.configs import Config
from dsopt.plan.model import Model
from dsopt.plan.network import Topology
from mpi_plan import SETTINGS, as_params, grads

W = MPI.COMM_WORLD
P, RANK = W.size, W.rank
STEPS = 9
MODEL = Model((1001, 437, 2, 77), "fp32")
CONFIGS = [Config("OneBitAdam"), Config("OneBitLamb"), Config("ZeroOneAdam"), Config("AdamW"),
           Config("AdamW", "int4", "int8", path="czero"), Config("AdamW", "sign", "bf16", path="czero"),
           Config("Lion", "int8", "int8", path="czero")]


def expected(cfg, topo, k):
    """(bytes sent, bytes across nodes) of update k (1-based)."""
    sb = pbytes.step_bytes(cfg, MODEL, P, SETTINGS, topo)
    sx = pbytes.step_cross_bytes(cfg, MODEL, topo, SETTINGS)
    checks = (pbytes.check_bytes(P), pbytes.cross_allreduce(topo, 16)) if k <= 3 else (0, 0)
    schedule = cfg.info.schedule
    if schedule == "freeze":
        warm, _ = pbytes.onebit_phases(SETTINGS, k)
        field = "warmup" if k <= warm else "compressed"
    elif schedule == "zero_one":
        field = {"full": "warmup", "1bit": "compressed", "sync": "compressed",
                 "local": "local"}[pbytes.zoadam_phases(SETTINGS, k)[-1]]
    else:
        field = "steady"
    return getattr(sb, field) + checks[0], getattr(sx, field) + checks[1]


def main():
    comm = dsopt.Communicator.from_mpi4py(W)
    mismatches, checks = [], 0
    for r in [d for d in range(2, P) if P % d == 0]:
        for hierarchy in ("flat", "node_aware"):
            topo = Topology(P // r, r, hierarchy == "node_aware")
            for cfg in CONFIGS:
                config = dict(cfg.dsopt_config(MODEL, SETTINGS),
                              topology={"hierarchy": hierarchy, "ranks_per_node": r})
                name = f"{cfg.name} {hierarchy} {P // r} x {r} rank {RANK}"
                with dsopt.Optimizer(config, as_params(MODEL, np.random.default_rng(7)),
                                     comm=comm) as opt:
                    for k in range(1, STEPS + 1):
                        info = opt.step(grads(MODEL, k, RANK))
                        want = expected(cfg, topo, k)
                        checks += 1
                        if (info.bytes_sent, info.bytes_inter_node) != want:
                            mismatches.append(f"{name}: step {k} (phase {info.phase}) sent "
                                              f"{info.bytes_sent} across {info.bytes_inter_node}, "
                                              f"planner {want[0]} across {want[1]}")
    text = json.dumps({"checks": checks, "mismatches": mismatches})
    out = os.environ.get("DSOPT_TEST_RESULTS")
    if out:
        with open(os.path.join(out, f"rank{RANK}.json"), "w") as f:
            f.write(text)
    else:
        print(f"rank {RANK}: {checks} checks, {len(mismatches)} mismatches", *mismatches[:30], sep="\n")


if __name__ == "__main__":
    main()
