"""A rank that dies in the middle of a run (SIGKILL, from the test's own
worker) leaves no rank blocked for ever: under mpirun the survivors return
an error from dsopt or are ended by the launcher, within a bounded time.
Every run is under a timeout; a hang fails the test instead of blocking
the suite."""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conftest
from dsopt_testing import build_feature

WORKER = Path(__file__).with_name("mpi_fault.py")
BOUND_S = 60  # the survivors must be gone within this


@pytest.mark.parametrize("stage", [0, 2])
def test_a_killed_rank_does_not_leave_the_others_waiting(stage):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", DSOPT_FAULT_STAGE=str(stage), DSOPT_FAULT_STEP="5",
               PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
    cmd = [shutil.which("mpirun"), "-np", "3", "--oversubscribe", sys.executable, str(WORKER)]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S + 30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run did not end within {BOUND_S + 30} s after a rank was killed:\n{e.stdout}{e.stderr}")
    elapsed, ended = time.monotonic() - start, time.time()
    out = proc.stdout + proc.stderr
    assert "rank 1 killing itself at step 5" in out, out
    assert proc.returncode != 0, out
    assert elapsed < BOUND_S, f"{elapsed:.1f} s"
    for r in (0, 2):  # no survivor went on as if nothing happened
        assert f"rank {r} done" not in out, out
    killed_at = float(re.search(r"killing itself at step 5 at ([0-9.]+)", out).group(1))
    print(f"\nstage {stage}: the job ended {ended - killed_at:.2f} s after rank 1 was killed")


@pytest.mark.parametrize("case", ["absent", "mismatch", "identical"])
def test_comm_timeout_ends_an_mpi_wait_for_a_rank_that_left(case):
    """mpi_timeout.py: a peer that stops making dsopt calls (it sleeps, or
    leaves after both saw DSOPT_EMISMATCH) costs the waiting rank
    comm_timeout (2 s) and a CommError, not a hang; both then exit cleanly.
    And the collectives that a timeout makes nonblocking compute the same."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", DSOPT_TIMEOUT_CASE=case,
               PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
    cmd = [shutil.which("mpirun"), "-np", "2", "--oversubscribe", sys.executable,
           str(WORKER.with_name("mpi_timeout.py"))]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the run did not end within {BOUND_S} s:\n{e.stdout}{e.stderr}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    if case == "identical":  # the nonblocking forms give the same results
        assert "rank 0 identical" in out and "rank 1 identical" in out, out
        return
    assert "rank 1 leaves" in out, out
    if case == "mismatch":
        assert out.count("mismatch: ") == 2, out
    match = re.search(r"rank 0 returned after ([0-9.]+) s: .*did not complete within comm_timeout = 2 s",
                      out)
    assert match, out
    assert 2.0 <= float(match.group(1)) < 2.0 + 5, out


def test_comm_timeout_is_a_config_key_that_does_not_name_the_run():
    import numpy as np
    import dsopt
    base = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    with pytest.raises(dsopt.InvalidArgument, match="comm_timeout"):
        dsopt.Optimizer(dict(base, comm_timeout=-1), [np.ones(3, np.float32)])
    blobs = []
    for extra in ({}, {"comm_timeout": 30}):
        with dsopt.Optimizer(dict(base, **extra), [np.ones(3, np.float32)]) as opt:
            opt.step([np.full(3, 0.5, np.float32)])
            blobs.append(opt.state_dict())
    assert blobs[0] == blobs[1]
