"""Run under ``mpirun -np P``: 1-bit LAMB on P ranks (test_onebit_lamb.py).
Writes each rank's results to ``$DSOPT_TEST_RESULTS`` as npz files
(onebit_runs.save_npz); ``rank<r>.txt`` lists the phases that finished.
Phases (``$DSOPT_TEST_PHASES``): scenarios (saving blobs of the RESUME
scenarios after SAVE_AFTER updates), resume (each saved blob loaded into a
fresh optimizer, run to the end), load (the blob after 6 updates of
``$DSOPT_ONEBIT_LOAD_WORLD`` ranks in ``$DSOPT_ONEBIT_LOAD_FROM``)."""

import os
import sys

import lamb_runs
import onebit_runs as runs
from mpi_phases import main, out_path, run_scenarios


def phase_scenarios(comm, rank, size):
    return run_scenarios(lamb_runs, comm, rank, size, runs.run_dsopt, runs.save_npz)


def phase_resume(comm, rank, size):
    for name in lamb_runs.RESUME:
        sc = lamb_runs.BY_NAME[name]
        for s in lamb_runs.SAVE_AFTER:
            p, _, blobs = runs.load_npz(out_path(f"{name}_saved{s}_r{rank}.npz"), len(sc.sizes))
            params, infos, loaded, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, s, size)
            runs.save_npz(out_path(f"{name}_resume{s}_r{rank}.npz"), params, infos, loaded=loaded, blob=final)
    return len(lamb_runs.RESUME)


def phase_load(comm, rank, size):
    src_world = int(os.environ["DSOPT_ONEBIT_LOAD_WORLD"])
    sc = lamb_runs.BY_NAME[lamb_runs.RESUME[0]]
    src = os.path.join(os.environ["DSOPT_ONEBIT_LOAD_FROM"], f"{sc.name}_saved6_r{rank % src_world}.npz")
    p, _, blobs = runs.load_npz(src, len(sc.sizes))
    params, infos, loaded, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, 6, size)
    runs.save_npz(out_path(f"load_r{rank}.npz"), params, infos, loaded=loaded, blob=final)
    return f"from {src_world} ranks"


PHASES = {"scenarios": phase_scenarios, "resume": phase_resume, "load": phase_load}


if __name__ == "__main__":
    sys.exit(main(PHASES))
