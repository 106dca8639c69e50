"""Run under ``mpirun -np P``: AdamW (stage ``$DSOPT_FAULT_STAGE``) steps in a
loop; rank 1 kills itself with SIGKILL at step ``$DSOPT_FAULT_STEP`` (in the
middle of the run, between two collective calls, while the others are
already waiting in the next one). Each rank prints what happened to it:
"rank R step K" after every step, "rank R error: ..." when a dsopt call
returns an error, "rank R done" when it finished every step."""

import os
import signal
import sys
import time

import numpy as np

from mpi_world import world

import dsopt


def main():
    comm, rank, size, finalize, abort, _ = world()
    stage = int(os.environ.get("DSOPT_FAULT_STAGE", "0"))
    kill_at = int(os.environ.get("DSOPT_FAULT_STEP", "5"))
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "threads": 1,
              "zero_optimization": {"stage": stage}}
    params = [np.linspace(-1, 1, 100003, dtype=np.float32), np.ones(17, np.float32)]
    rng = np.random.default_rng(rank)
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for k in range(50):
            if rank == 1 and k == kill_at:
                print(f"rank {rank} killing itself at step {k} at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                opt.step([rng.standard_normal(p.size).astype(np.float32) for p in params])
            except dsopt.DsoptError as e:
                print(f"rank {rank} error: {e}", flush=True)
                return 1
            print(f"rank {rank} step {k}", flush=True)
    print(f"rank {rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
