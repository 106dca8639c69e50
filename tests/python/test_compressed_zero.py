"""Compressed ZeRO (docs/guides/compressed-zero.md): the numpy reference of
the codecs and the gradient path against dsopt at 1, 2, 3 and 4 ranks under
mpirun (mpi_compressed_zero.py makes every check on the ranks; a test here
fails with that run's traceback), with gradient accumulation, resume,
resharding, the memory formula and the int8 parameter codec's values at any
allgather bucket size; and the config rules in one process."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_compressed_zero.py")
PHASES = ["reference", "accumulation", "resume", "reshard", "memory", "bucket"]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_compressed_zero_matches_the_numpy_reference(world, tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    folder = mpi_runner.mpirun(SCRIPT, world, tmp_path, PHASES, timeout=600)
    lines = (folder / "rank0.txt").read_text().splitlines()
    # Two checks per scenario, stage 1 and 2 (22 scenarios, among them two
    # of Lion, five of 16-bit parameters with a parameter codec and one on 3
    # threads); at 2+ ranks the reference phase also checks that a reference
    # with fp32 residuals disagrees.
    assert f"reference OK {46 if world == 1 else 47}" in lines
    assert "memory OK 5" in lines
    assert "bucket OK 6" in lines  # the int8 parameter codec at four allgather bucket sizes


@pytest.mark.parametrize("world", [4, 6])
def test_node_aware_compressed_zero_matches_the_numpy_reference(world, tmp_path):
    """2 x 2 and 3 x 2 (declared ranks_per_node): the node-aware codes
    against the numpy reference, the bytes against the formulas of
    docs/design/node-aware-zero.md, the memory against the planner's,
    deferred allgather, accumulation, resume and topology changes
    (mpi_compressed_zero.py node_aware_phase)."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    folder = mpi_runner.mpirun(SCRIPT, world, tmp_path, ["node_aware"], timeout=900)
    lines = (folder / "rank0.txt").read_text().splitlines()
    # 9 scenarios x (stage 1, 2, flat), R = 1, accumulation x 2, deferred,
    # 3 resumes, 2 topology changes x (load, reshard), memory x 4.
    assert "node_aware OK 42" in lines


# ---- one process ------------------------------------------------------------

def make(compression, stage=2, **zero):
    params = [np.linspace(-1, 1, n, dtype=np.float32) for n in (5, 3)]
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
              "zero_optimization": dict(zero, stage=stage, compression=compression)}
    return dsopt.Optimizer(config, params), params


@pytest.mark.parametrize("compression,stage,zero,pattern", [
    ({"gradients": "int2"}, 2, {}, r"gradients.*one of \"none\", \"int8\", \"int4\", \"sign\""),
    ({"parameters": "fp8"}, 2, {}, r"parameters.*one of \"none\", \"bf16\", \"int8\""),
    ({"gradients": 8}, 2, {}, "gradients"),
    ({"error_feedback": "yes"}, 2, {}, "true or false"),
    ({"gradient_block_size": 12}, 2, {}, "gradient_block_size.*multiple of 8"),
    ({"parameter_block_size": 4}, 2, {}, r"parameter_block_size.*\[8, 65536\]"),
    ({"gradient_block_size": 1 << 20}, 2, {}, r"gradient_block_size.*\[8, 65536\]"),
    ({"block_size": 64}, 2, {}, "unknown key"),
    ({"gradients": "int4", "level": 3}, 2, {}, "unknown key"),
    ({"gradients": "int4"}, 0, {}, "stage 1 or 2"),
    ({"parameters": "int8"}, 0, {}, "stage 1 or 2"),
    ({"gradients": "sign"}, 2, {"reduce_scatter": False}, "reduce_scatter"),
    ("int4", 2, {}, "JSON object"),
])
def test_bad_compression_config_is_rejected(compression, stage, zero, pattern):
    with pytest.raises(dsopt.InvalidArgument, match=pattern):
        make(compression, stage, **zero)


def test_defaults_and_canonical_config():
    canonical = dsopt.canonical_config({"optimizer": {"type": "AdamW"},
                                        "zero_optimization": {"stage": 2}})
    assert canonical["zero_optimization"]["compression"] == {
        "gradients": "none", "parameters": "none", "error_feedback": True, "gradient_block_size": 64,
        "parameter_block_size": 256}
    chosen = dsopt.canonical_config({"optimizer": {"type": "Lamb"}, "zero_optimization": {
        "stage": 1, "compression": {"gradients": "int4", "parameters": "int8",
                                    "error_feedback": False, "gradient_block_size": 32,
                                    "parameter_block_size": 128}}})
    assert chosen["zero_optimization"]["compression"] == {
        "gradients": "int4", "parameters": "int8", "error_feedback": False, "gradient_block_size": 32,
        "parameter_block_size": 128}


@pytest.mark.parametrize("opt_type", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam"])
def test_one_bit_optimizers_stay_at_stage_0(opt_type):
    params = [np.ones(4, np.float32)]
    config = {"optimizer": {"type": opt_type},
              "zero_optimization": {"stage": 2, "compression": {"gradients": "sign"}}}
    with pytest.raises(dsopt.Unsupported, match="stage 0"):
        dsopt.Optimizer(config, params)


def test_one_rank_nothing_travels_so_nothing_is_compressed():
    plain, p0 = make({}, reduce_bucket_size=4)
    packed, p1 = make({"gradients": "sign", "parameters": "int8"}, reduce_bucket_size=4)
    rng = np.random.default_rng(5)
    with plain, packed:
        for _ in range(3):
            grads = [rng.standard_normal(n).astype(np.float32) for n in (5, 3)]
            assert plain.step(grads).bytes_sent == packed.step(grads).bytes_sent == 0
        for x, y in zip(p0, p1):
            assert np.array_equal(x, y)
        assert plain.memory_usage() == packed.memory_usage()
