"""Run under ``mpirun -np 2``: with ``"comm_timeout"``, a rank whose peer
stops making dsopt's collective calls gets DSOPT_ECOMM after the timeout
instead of waiting for ever. ``$DSOPT_TIMEOUT_CASE``:

- ``absent``: after three steps rank 1 sleeps, then exits without another
  dsopt call; rank 0 steps once more.
- ``mismatch``: rank 0 steps while rank 1 loads a blob (both get
  DSOPT_EMISMATCH); rank 1 then closes its optimizer and exits, while rank 0
  tries the step again.
- ``identical``: with the timeout, MPI's collectives run in their
  nonblocking forms; ZeRO-2 (its ring reduce-scatter) and 1-bit Adam's
  compression stage (its alltoall and allgather requests) end bit-identical
  to the same runs without it. Prints "rank R identical".

Rank 0 prints "rank 0 returned after S s: <error>"."""

import os
import sys
import time

import numpy as np

from mpi_world import world

import dsopt

TIMEOUT_S = 2.0


def identical(comm, rank):
    configs = [{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": 2}},
               {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 2}}}]
    for config in configs:
        results = []
        for timeout in (0, 30):
            params = [np.linspace(-1, 1, 300007, dtype=np.float32), np.ones(17, np.float32)]
            rng = np.random.default_rng(rank)
            with dsopt.Optimizer(dict(config, threads=1, comm_timeout=timeout), params,
                                 comm=comm) as opt:
                for _ in range(5):
                    opt.step([rng.standard_normal(p.size).astype(np.float32) for p in params])
            results.append(b"".join(p.tobytes() for p in params))
        assert results[0] == results[1], config
    print(f"rank {rank} identical", flush=True)


def main():
    comm, rank, size, finalize, abort, _ = world()
    case = os.environ["DSOPT_TIMEOUT_CASE"]
    if case == "identical":
        identical(comm, rank)
        comm.close()
        finalize()
        return 0
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "threads": 1,
              "comm_timeout": TIMEOUT_S}
    params = [np.linspace(-1, 1, 1001, dtype=np.float32), np.ones(17, np.float32)]
    rng = np.random.default_rng(rank)

    def grads():
        return [rng.standard_normal(p.size).astype(np.float32) for p in params]

    opt = dsopt.Optimizer(config, params, comm=comm)
    for _ in range(3):
        opt.step(grads())
    blob = opt.state_dict()
    if case == "mismatch":
        try:
            opt.step(grads()) if rank == 0 else opt.load_state_dict(blob)
        except dsopt.Mismatch as e:
            print(f"rank {rank} mismatch: {e}", flush=True)
    if rank == 1:
        if case == "absent":
            time.sleep(3 * TIMEOUT_S)
        opt.close()
        print("rank 1 leaves", flush=True)
    else:
        start = time.monotonic()
        try:
            opt.step(grads())
            print("rank 0 stepped", flush=True)
        except dsopt.CommError as e:
            print(f"rank 0 returned after {time.monotonic() - start:.2f} s: {e}", flush=True)
        opt.close()
    comm.close()
    finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
