#!/usr/bin/env python3
"""The two levels of a multi-node MPI job, measured as the planner sees
them (dsopt.plan.calibrate.measure_network: AdamW steps on a 16-element
and on a large model, the update taken off): inside the nodes (every
node's ranks at once, over MPI_Comm_split_type's shared-memory groups) and
between them (the ranks of one local index, one per node, every such rail
at once). Then the link between the nodes as the compressed collectives
use it: MPI all-to-alls over all ranks, blocks of `--block` bytes (the
size of compressed ZeRO's codes per destination), several back to back as
a step's buckets go, each node's interface carrying R (P - R) blocks each
way per call. Rank 0 prints

    link: node latency <s> bandwidth <bytes/s per rank>
    link: rail latency <s> bandwidth <bytes/s per rank>
    link: across alltoall bandwidth <bytes/s per node, each way>

Run under mpirun, e.g. on the emulated two nodes of bench/netem_two_nodes.sh
(bench/node_aware_e2e.py does, and plans with the figures)."""

import argparse
import statistics
import sys
import time

import numpy as np

from mpi4py import MPI

import dsopt
from dsopt.plan.calibrate import measure_network
from dsopt.plan.profile import load


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=2 ** 22, help="elements of the large allreduce")
    ap.add_argument("--profile", help="the profile whose AdamW cost is taken off (default: the user's)")
    ap.add_argument("--block", type=int, default=1 << 20, help="bytes per destination of the all-to-alls")
    ap.add_argument("--calls", type=int, default=4, help="all-to-alls back to back per timing")
    ap.add_argument("--repeats", type=int, default=5, help="timings (their median is taken)")
    a = ap.parse_args()
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    rail = world.Split(color=node.rank, key=world.rank)
    prof = load(a.profile)
    for name, comm in (("node", node), ("rail", rail)):
        # Every rank meets every barrier, whatever size its groups have
        # (the ranks of one group agree on its size, not all ranks on all).
        if comm.size >= 2:
            with dsopt.Communicator.from_mpi4py(comm) as c:
                net = measure_network(c, prof, large=a.numel)
            if world.rank == 0:
                print(f"link: {name} latency {net['latency']:.9f} bandwidth {net['bandwidth']:.1f}", flush=True)
        elif world.rank == 0:
            print(f"link: {name} has one rank: nothing to measure", flush=True)
        world.Barrier()
    if node.size < world.size:
        bw = alltoall_bandwidth(world, node.size, a.block, a.calls, a.repeats)
        if world.rank == 0:
            print(f"link: across alltoall bandwidth {bw:.1f}", flush=True)
    return 0


def alltoall_bandwidth(world, ranks_per_node, block, calls, repeats):
    """Bytes per second each node's interface sends off the node (each
    way) in `calls` all-to-alls of `block` bytes per destination back to
    back, the median of `repeats` timings (after one untimed call)."""
    p = world.size
    send = np.random.default_rng(world.rank).integers(0, 255, block * p, dtype=np.uint8)
    recv = np.empty_like(send)
    world.Alltoall(send, recv)
    times = []
    for _ in range(repeats):
        world.Barrier()
        t = time.perf_counter()
        for _ in range(calls):
            world.Alltoall(send, recv)
        world.Barrier()
        times.append(time.perf_counter() - t)
    across = ranks_per_node * (p - ranks_per_node) * block * calls
    return across / statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
