"""Rules that need two MPI ranks. One ``mpirun -np 2`` of mpi_two_ranks.py
per way of reaching MPI (mpi4py, or libmpi through ctypes) runs every phase;
each test checks one phase's result on both ranks."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import conftest
import dsopt
from dsopt_testing import build_feature
from mpi_two_ranks import RESHARD_CONFIG, SIZES, continue_with_shared_grads

SCRIPT = Path(__file__).with_name("mpi_two_ranks.py")


class TwoRankRun:
    def __init__(self, mode, results_dir):
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMP_NUM_THREADS="1", DSOPT_TEST_MPI=mode, DSOPT_TEST_RESULTS=str(results_dir),
                   PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
        cmd = [shutil.which("mpirun"), "-np", "2", "--oversubscribe", sys.executable, str(SCRIPT)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        self.returncode = proc.returncode
        self.output = proc.stdout + proc.stderr
        self.dir = results_dir
        self.results = {}
        self.modes = {}
        for rank in (0, 1):
            path = results_dir / f"rank{rank}.txt"
            lines = path.read_text().splitlines() if path.exists() else []
            self.modes[rank] = lines[0] if lines else None
            for line in lines[1:]:
                match = re.match(r"^(\w+) OK ?(.*)$", line)
                if match:
                    self.results.setdefault(match.group(1), {})[rank] = match.group(2)

    def passed(self, phase):
        """The phase's result on each rank; fails the test when a rank lacks it."""
        got = self.results.get(phase, {})
        assert set(got) == {0, 1}, f"{phase} did not pass on both ranks (exit {self.returncode}):\n{self.output}"
        return got


@pytest.fixture(scope="module", params=["mpi4py", "ctypes"])
def two_ranks(request, tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    if request.param == "mpi4py":
        pytest.importorskip("mpi4py", reason="mpi4py not installed (the ctypes variant still runs)")
    run = TwoRankRun(request.param, tmp_path_factory.mktemp(f"mpi_{request.param}"))
    assert run.modes == {0: f"MPI via {request.param}", 1: f"MPI via {request.param}"}, run.output
    return run


def test_nonfinite_gradient_on_one_rank_skips_on_every_rank(two_ranks):
    digests = two_ranks.passed("nonfinite_on_one_rank_skips_everywhere")
    assert digests[0] == digests[1], "ranks hold different parameters"


def test_ranks_disagreeing_on_config_all_fail_with_mismatch(two_ranks):
    two_ranks.passed("ranks_disagreeing_on_config_all_fail")


def test_ranks_disagreeing_on_shapes_all_fail_with_mismatch(two_ranks):
    two_ranks.passed("ranks_disagreeing_on_shapes_all_fail")


def test_bad_gradient_on_one_rank_fails_every_rank_and_changes_nothing(two_ranks):
    digests = two_ranks.passed("bad_gradient_on_one_rank_fails_everywhere")
    assert digests[0] == digests[1], "ranks hold different parameters"


def test_blob_saved_at_two_ranks_loads_at_one_and_continues_identically(two_ranks):
    digests = two_ranks.passed("blob_saved_at_two_ranks_loads_at_one")
    assert digests[0] == digests[1]
    blob = (two_ranks.dir / "p2_blob.bin").read_bytes()
    after = np.load(two_ranks.dir / "p2_after.npz")
    expected = [after[f"arr_{i}"] for i in range(len(SIZES))]
    params = [np.zeros(n, np.float16) for n in SIZES]  # restored from the masters in the blob
    with dsopt.Optimizer(RESHARD_CONFIG, params) as opt:
        opt.load_state_dict(blob)
        continue_with_shared_grads(opt)
    for p, e in zip(params, expected):
        assert np.array_equal(p.view(np.uint16), e.view(np.uint16))
