#!/usr/bin/env python3
"""The two levels of a multi-node MPI job, measured as the planner sees
them (dsopt.plan.calibrate.measure_network: AdamW steps on a 16-element
and on a large model, the update taken off): inside the nodes (every
node's ranks at once, over MPI_Comm_split_type's shared-memory groups) and
between them (the ranks of one local index, one per node, every such rail
at once). Rank 0 prints one line per level,

    link: node latency <s> bandwidth <bytes/s>
    link: rail latency <s> bandwidth <bytes/s>

Run under mpirun, e.g. on the emulated two nodes of bench/netem_two_nodes.sh
(bench/node_aware_e2e.py does, and plans with the figures)."""

import argparse
import sys

from mpi4py import MPI

import dsopt
from dsopt.plan.calibrate import measure_network
from dsopt.plan.profile import load


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=2 ** 22, help="elements of the large allreduce")
    ap.add_argument("--profile", help="the profile whose AdamW cost is taken off (default: the user's)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
