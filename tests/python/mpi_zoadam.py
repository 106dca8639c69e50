"""Run under ``mpirun -np P``: 0/1 Adam on P ranks (zoadam_runs.SCENARIOS),
each rank's results written to ``$DSOPT_TEST_RESULTS`` for
test_zero_one_adam.py. Phases (``$DSOPT_TEST_PHASES``): scenarios (saving
the RESUME scenarios' blobs after SAVE_AFTER updates), resume (each saved
blob into a fresh optimizer, run to the end), load (rank 0's blobs of
``$DSOPT_ZOADAM_LOAD_FROM``, another world size, loaded on every rank)."""

import os
import sys

import zoadam_runs as runs
from mpi_phases import main, out_path, run_scenarios


def phase_scenarios(comm, rank, size):
    return run_scenarios(runs, comm, rank, size)


def phase_resume(comm, rank, size, src_dir=None, prefix="resume"):
    for name in runs.RESUME:
        sc = runs.BY_NAME[name]
        for s in runs.SAVE_AFTER:
            src = os.path.join(src_dir, f"{name}_saved{s}_r0.npz") if src_dir else \
                out_path(f"{name}_saved{s}_r{rank}.npz")
            p, _, blobs = runs.load_npz(src, len(sc.sizes))
            params, infos, final = runs.resume_run(sc, comm, rank, blobs["blob"], p, s, size)
            runs.save_npz(out_path(f"{name}_{prefix}{s}_r{rank}.npz"), params, infos, blob=final)


def phase_load(comm, rank, size):
    phase_resume(comm, rank, size, os.environ["DSOPT_ZOADAM_LOAD_FROM"], "load")


PHASES = {"scenarios": phase_scenarios, "resume": phase_resume, "load": phase_load}


if __name__ == "__main__":
    sys.exit(main(PHASES))
