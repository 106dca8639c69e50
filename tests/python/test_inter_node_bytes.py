"""dsopt_step_info.bytes_inter_node under mpirun at 4 and 6 ranks, nodes
declared by "topology": {"ranks_per_node": R} (mpi_inter_node_bytes.py
makes the checks on the ranks)."""

from pathlib import Path

import pytest

import mpi_runner
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_inter_node_bytes.py")


@pytest.mark.parametrize("world", [4, 6])
def test_bytes_to_other_nodes_are_counted_pairwise(world, tmp_path):
    if not build_feature("mpi"):
        pytest.skip("libdsopt was built without MPI")
    folder = mpi_runner.mpirun(SCRIPT, world, tmp_path, ["allreduce", "alltoall", "bad_nodes"])
    lines = (folder / "rank0.txt").read_text().splitlines()
    divisors = sum(1 for d in range(1, world + 1) if world % d == 0)
    assert f"allreduce OK {divisors}" in lines
    assert f"alltoall OK {divisors}" in lines
    assert "bad_nodes OK 3" in lines
