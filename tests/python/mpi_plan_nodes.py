"""Worker of test_plan.py under ``mpirun -np P`` (P = 4 or 6): the
planner's bytes per step, sent and across nodes (``dsopt.plan.bytes``
with a Topology), against the library's ``info.bytes_sent`` and
``info.bytes_inter_node`` of every step, and its memory per rank
(``dsopt.plan.memory`` with the Topology) against ``memory_usage()`` and
``state_memory_usage()`` after every step, exactly, on declared nodes of R
ranks (every R that divides P but 1 and P), the compressed configurations
(the 1-bit family, compressed ZeRO) in both forms and an uncompressed
one, and the 1-bit family with the 1-bit node step ("node_reduce": "1bit";
on one node, the fp32 form). Writes ``rank<r>.json``: {"checks": count,
"mismatches": [...]}."""

import json
import os
import sys

import numpy as np
from mpi4py import MPI

import dsopt
from dsopt.plan import bytes as pbytes
from dsopt.plan.configs import Config
from dsopt.plan.memory import memory
from dsopt.plan.model import Model
from dsopt.plan.network import Cluster, Topology
from mpi_plan import SETTINGS, as_params, expected_memory, grads

W = MPI.COMM_WORLD
P, RANK = W.size, W.rank
STEPS = 9
MODEL = Model((1001, 437, 2, 77), "fp32")
CONFIGS = [Config("OneBitAdam"), Config("OneBitLamb"), Config("ZeroOneAdam"), Config("AdamW"),
           Config("AdamW", "int4", "int8", path="czero"), Config("AdamW", "sign", "bf16", path="czero"),
           Config("Lion", "int8", "int8", path="czero")]
# Large enough that the rail's 1-bit allreduce runs in several pieces (and
# keeps the largest piece's discard buffer): the 1-bit family, node-aware;
# its first tensor is reduce-scattered in place at R = 2 and 3, the second
# packed and padded.
BIG = Model((1_100_004, 70_001), "fp32")
# Nodes of R ranks: every R that divides P but 1 and P.
SPLITS = [d for d in range(2, P) if P % d == 0]
ONEBIT = [c for c in CONFIGS if c.onebit]
# (model, configurations, ranks per node, forms, steps); a form is a
# hierarchy, or "node_aware_1bit": "node_aware" with "node_reduce": "1bit"
# (the 1-bit family only). The last two: "node_aware" forced on one node of
# P ranks (a rail of one rank), where "1bit" is the fp32 form.
CASES = [(MODEL, CONFIGS, SPLITS, ("flat", "node_aware"), STEPS),
         (MODEL, ONEBIT, SPLITS, ("node_aware_1bit",), STEPS),
         (BIG, ONEBIT, SPLITS, ("node_aware", "node_aware_1bit"), 4),
         (MODEL, CONFIGS, [P], ("node_aware",), 5),
         (MODEL, ONEBIT, [P], ("node_aware_1bit",), 5)]


def expected(cfg, model, topo, k):
    """(bytes sent, bytes across nodes) of update k (1-based)."""
    sb = pbytes.step_bytes(cfg, model, P, SETTINGS, topo)
    sx = pbytes.step_cross_bytes(cfg, model, topo, SETTINGS)
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


def run(comm, model, cfg, r, form, steps, mismatches):
    """One configuration on nodes of r ranks; returns its count of checks."""
    hierarchy, onebit_node = form.replace("_1bit", ""), form.endswith("_1bit")
    topo = Cluster.parse(P, r, hierarchy=hierarchy, node_reduce="1bit" if onebit_node else "fp32").topo
    if topo != Topology(P // r, r, hierarchy == "node_aware", onebit_node and 1 < r < P):
        mismatches.append(f"{form} {P // r} x {r}: the cluster's topology is {topo}")
    topology = {"hierarchy": hierarchy, "ranks_per_node": r}
    if onebit_node:
        topology["node_reduce"] = "1bit"
    config = dict(cfg.dsopt_config(model, SETTINGS), topology=topology)
    name = f"{cfg.name} {model.numel} {form} {P // r} x {r} rank {RANK}"
    # MPI's communicators (the node and rail ones too) overlap transfers:
    # the 1-bit allreduce of a large model runs in pieces.
    want_mem = memory(cfg, model, P, SETTINGS, rank=RANK, overlapping_comm=True, topo=topo)
    checks = 0
    with dsopt.Optimizer(config, as_params(model, np.random.default_rng(7)), comm=comm) as opt:
        for k in range(1, steps + 1):
            info = opt.step(grads(model, k, RANK))
            want = expected(cfg, model, topo, k)
            got = opt.memory_usage()["host"], opt.state_memory_usage()["host"]
            exp = expected_memory(cfg, want_mem, SETTINGS, k)
            checks += 2
            if (info.bytes_sent, info.bytes_inter_node) != want:
                mismatches.append(f"{name}: step {k} (phase {info.phase}) sent {info.bytes_sent} across "
                                  f"{info.bytes_inter_node}, planner {want[0]} across {want[1]}")
            if got[0] != exp[0] or (exp[1] is not None and got[1] != exp[1]):
                mismatches.append(f"{name}: after step {k} memory_usage {got[0]} state {got[1]}, "
                                  f"planner {exp[0]} state {exp[1]}")
    return checks


def main():
    comm = dsopt.Communicator.from_mpi4py(W)
    mismatches, checks = [], 0
    for model, configs, splits, forms, steps in CASES:
        for r in splits:
            for form in forms:
                for cfg in configs:
                    checks += run(comm, model, cfg, r, form, steps, mismatches)
    text = json.dumps({"checks": checks, "mismatches": mismatches})
    out = os.environ.get("DSOPT_TEST_RESULTS")
    if out:
        with open(os.path.join(out, f"rank{RANK}.json"), "w") as f:
            f.write(text)
    else:
        print(f"rank {RANK}: {checks} checks, {len(mismatches)} mismatches", *mismatches[:30], sep="\n")


if __name__ == "__main__":
    main()
