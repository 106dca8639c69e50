"""Run under ``mpirun -np P``: 0/1 Adam on P ranks (zoadam_runs.SCENARIOS),
each rank's results written to ``$DSOPT_TEST_RESULTS`` for
test_zero_one_adam.py. Phases (``$DSOPT_ZOADAM_PHASES``): scenarios (saving
the RESUME scenarios' blobs after SAVE_AFTER updates), resume (each saved
blob into a fresh optimizer, run to the end), load (rank 0's blobs of
``$DSOPT_ZOADAM_LOAD_FROM``, another world size, loaded on every rank)."""

import os
import sys
import traceback

import zoadam_runs as runs
from mpi_world import world


def out_path(name):
    return os.path.join(os.environ["DSOPT_TEST_RESULTS"], name)


def phase_scenarios(comm, rank, size):
    for sc in runs.SCENARIOS:
        save_after = runs.SAVE_AFTER if sc.name in runs.RESUME else ()
        params, infos, blob, saved = runs.run_dsopt(sc, comm, rank, size, save_after)
        runs.save_npz(out_path(f"{sc.name}_r{rank}.npz"), params, infos, blob=blob)
        for s, (b, p) in saved.items():
            runs.save_npz(out_path(f"{sc.name}_saved{s}_r{rank}.npz"), p, [], blob=b)


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


def main():
    comm, rank, size, finalize, abort, how = world()
    results = open(out_path(f"rank{rank}.txt"), "w")
    results.write(f"MPI via {how}\n")
    for name in os.environ.get("DSOPT_ZOADAM_PHASES", "scenarios").split(","):
        try:
            PHASES[name](comm, rank, size)
        except BaseException:
            traceback.print_exc()
            print(f"RANK {rank} {name} FAILED", flush=True)
            abort(1)
            return 1
        results.write(f"{name} OK\n")
        results.flush()
    results.close()
    comm.close()
    finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
