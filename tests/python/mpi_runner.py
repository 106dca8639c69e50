"""``mpirun -np P`` of a phase script (mpi_onebit.py, mpi_lamb.py, mpi_zoadam.py): the
script writes rank<r>.txt into the results folder, one line per finished
phase; a rank that did not finish every phase fails the test with the
output of the run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import conftest


def mpirun(script: Path, world: int, results: Path, phases, extra_env=None, timeout=240):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", DSOPT_TEST_RESULTS=str(results), DSOPT_TEST_PHASES=",".join(phases),
               PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
    env.update(extra_env or {})
    cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", sys.executable, str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for r in range(world):
        path = results / f"rank{r}.txt"
        done = path.read_text().splitlines()[1:] if path.exists() else []
        got = [line.split()[0] for line in done]
        assert got == list(phases), \
            f"mpirun -np {world} {phases}: rank {r} finished {got} (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    return results
