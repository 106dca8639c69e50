"""Run under ``mpirun -np P``: 1-bit Adam on P ranks. Writes each rank's
results to ``$DSOPT_TEST_RESULTS`` (npz files, see onebit_runs.py) for
test_onebit_adam.py to compare against the reference; ``rank<r>.txt`` lists
the phases that finished. Phases (``$DSOPT_TEST_PHASES``, comma-separated):

* scenarios: every scenario of onebit_runs.SCENARIOS, saving blobs of the
  RESUME scenarios after SAVE_AFTER updates;
* resume: each saved blob loaded into a fresh optimizer, run to the end;
* load: the blobs of another world size (``$DSOPT_ONEBIT_LOAD_FROM``, written
  by ``$DSOPT_ONEBIT_LOAD_WORLD`` ranks) after 6 updates, loaded here and
  run to the end;
* load_p1: the same with the one-rank blob of ``$DSOPT_ONEBIT_LOAD_P1_FROM``;
* convergence: the training problem of onebit_convergence.py.
"""

import os
import sys

import numpy as np

import onebit_runs as runs
from mpi_phases import main, out_path, run_scenarios


def phase_scenarios(comm, rank, size):
    return run_scenarios(runs, comm, rank, size)


def phase_resume(comm, rank, size):
    for name in runs.RESUME:
        sc = runs.BY_NAME[name]
        for s in runs.SAVE_AFTER:
            p, _, blobs = runs.load_npz(out_path(f"{name}_saved{s}_r{rank}.npz"), len(sc.sizes))
            params, infos, loaded, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, s, size)
            runs.save_npz(out_path(f"{name}_resume{s}_r{rank}.npz"), params, infos, loaded=loaded, blob=final)
    return len(runs.RESUME)


def phase_load(comm, rank, size):
    src_dir = os.environ["DSOPT_ONEBIT_LOAD_FROM"]
    src_world = int(os.environ["DSOPT_ONEBIT_LOAD_WORLD"])
    sc = runs.BY_NAME[runs.RESUME[0]]
    src = os.path.join(src_dir, f"{sc.name}_saved6_r{rank % src_world}.npz")
    p, _, blobs = runs.load_npz(src, len(sc.sizes))
    params, infos, loaded, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, 6, size)
    runs.save_npz(out_path(f"load_r{rank}.npz"), params, infos, loaded=loaded, blob=final)
    return f"from {src_world} ranks"


def phase_load_p1(comm, rank, size):
    """Every rank loads the one-rank blob of $DSOPT_ONEBIT_LOAD_P1_FROM."""
    sc = runs.BY_NAME[runs.RESUME[0]]
    src = os.path.join(os.environ["DSOPT_ONEBIT_LOAD_P1_FROM"], f"{sc.name}_saved6_r0.npz")
    p, _, blobs = runs.load_npz(src, len(sc.sizes))
    params, infos, loaded, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, 6, size)
    runs.save_npz(out_path(f"load_p1_r{rank}.npz"), params, infos, loaded=loaded, blob=final)
    return "from 1 rank"


def phase_convergence(comm, rank, size):
    import onebit_convergence

    losses = onebit_convergence.train_both(comm, rank, size)
    np.savez(out_path(f"convergence_r{rank}.npz"), **losses)
    return "done"


PHASES = {
    "scenarios": phase_scenarios,
    "resume": phase_resume,
    "load": phase_load,
    "load_p1": phase_load_p1,
    "convergence": phase_convergence,
}


if __name__ == "__main__":
    sys.exit(main(PHASES))
