"""Measures the communicator of an MPI job and saves its latency and
bandwidth in the profile (rank 0 writes it):

    mpirun -np 4 python -m dsopt.plan.measure_network [--profile PATH]

then ``python -m dsopt.plan ... --measured-network`` plans on it. From
Python, `calibrate.measure_network(comm, profile)` does the same with any
dsopt.Communicator (torch.distributed, NCCL, callbacks)."""

import argparse
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dsopt.plan.measure_network")
    ap.add_argument("--profile", help="profile JSON (default ~/.cache/dsopt/plan-profile.json)")
    ap.add_argument("--numel", type=int, default=2 ** 22, help="elements of the large allreduce")
    args = ap.parse_args(argv)
    from mpi4py import MPI

    import dsopt

    from .calibrate import measure_network
    from .profile import load, save

    prof = load(args.profile)
    with dsopt.Communicator.from_mpi4py(MPI.COMM_WORLD) as comm:
        net = measure_network(comm, prof, large=args.numel)
    if MPI.COMM_WORLD.rank == 0:
        prof.network = net
        path = save(prof, args.profile)
        print(f"{net['ranks']} ranks: latency {net['latency'] * 1e6:.1f} us per round, "
              f"allreduce bandwidth {net['bandwidth'] * 8 / 1e9:.3f} Gbit/s per rank; saved in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
