"""What the mpirun worker scripts (mpi_onebit.py, mpi_lamb.py,
mpi_zoadam.py) share: where results go, the phase that runs every scenario
and saves the resume blobs, and the driver that runs the phases named in an
environment variable and records which finished in ``rank<r>.txt``."""

import os
import sys
import traceback

from mpi_world import world


def out_path(name):
    return os.path.join(os.environ["DSOPT_TEST_RESULTS"], name)


def run_scenarios(runs, comm, rank, size, run_dsopt=None, save_npz=None):
    """Every scenario of ``runs.SCENARIOS``, saving the blobs of the
    ``runs.RESUME`` scenarios after ``runs.SAVE_AFTER`` updates.
    ``run_dsopt``/``save_npz`` default to the module's own."""
    run_dsopt = run_dsopt or runs.run_dsopt
    save_npz = save_npz or runs.save_npz
    for sc in runs.SCENARIOS:
        save_after = runs.SAVE_AFTER if sc.name in runs.RESUME else ()
        params, infos, blob, saved = run_dsopt(sc, comm, rank, size, save_after=save_after)
        save_npz(out_path(f"{sc.name}_r{rank}.npz"), params, infos, blob=blob)
        for s, (b, p) in saved.items():
            save_npz(out_path(f"{sc.name}_saved{s}_r{rank}.npz"), p, [], blob=b)
    return len(runs.SCENARIOS)


def main(phases):
    """Runs the comma-separated phases of ``$DSOPT_TEST_PHASES`` (default
    "scenarios"), each ``phases[name](comm, rank, size)``; a failing phase
    aborts every rank so that none waits."""
    comm, rank, size, finalize, abort, how = world()
    results = open(out_path(f"rank{rank}.txt"), "w")
    results.write(f"MPI via {how}\n")
    for name in os.environ.get("DSOPT_TEST_PHASES", "scenarios").split(","):
        try:
            result = phases[name](comm, rank, size)
        except BaseException:
            traceback.print_exc()
            print(f"RANK {rank} {name} FAILED", flush=True)
            sys.stdout.flush()
            abort(1)
            return 1
        results.write(f"{name} OK" + ("" if result is None else f" {result}") + "\n")
        results.flush()
    results.close()
    comm.close()
    finalize()
    return 0
