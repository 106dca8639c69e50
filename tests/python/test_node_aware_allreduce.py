"""The node-aware 1-bit compressed allreduce (docs/design/node-aware-allreduce.md)
against the numpy reference of node_aware_reference.py, bit for bit, under
real mpirun on declared topologies: 4 ranks as 2 x 2, 4 x 1 (R = 1, the flat
form) and 1 x 4 (N = 1, no compression), 6 ranks as 3 x 2, 2 x 3 and 6 x 1;
with the 1-bit node step (node_reduce "1bit") at 2 x 2, 3 x 2, 2 x 3 and on
one node (where it is the fp32 form).

One ``mpirun -np P`` of tests/internal/node_aware_driver.cpp per topology
records each rank's inputs, outputs and errors over several calls (the error
feedback carried between them), the flat CompressedAllreduce's on the same
inputs, and the bytes each communicator sent. Needs no Python extension; the
driver comes from $DSOPT_NODE_AWARE_DRIVER or the build folder."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from node_aware_reference import (NodeAwareReference, flat_bytes, node_bytes, rail_bytes,
                                  slice_length)
from onebit_reference import padded_length

REPO_ROOT = Path(__file__).resolve().parents[2]
# Odd sizes, some shorter than R, one over several sum blocks of 4096.
SIZES = [1, 7, 13, 100, 1000, 4097, 33, 65, 70001, 72000, 393216]  # the last reduce-scattered in place at R <= 6;
# 72000 and 393216 need no padding at R = 2 and 3 (the 1-bit node step decodes them straight into x)
CALLS = 4
SEED = 23
# (P, R, node reduce)
TOPOLOGIES = [(4, 2, "fp32"), (6, 2, "fp32"), (6, 3, "fp32"), (4, 1, "fp32"), (6, 1, "fp32"), (4, 4, "fp32"),
              (4, 2, "1bit"), (6, 2, "1bit"), (6, 3, "1bit"), (4, 4, "1bit")]


def driver_path():
    explicit = os.environ.get("DSOPT_NODE_AWARE_DRIVER")
    if explicit:
        return Path(explicit)
    build = Path(os.environ.get("DSOPT_LIBRARY_DIR", REPO_ROOT / "build"))
    return build / "tests" / "internal" / "node_aware_driver"


def bits(a):
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def assert_bits_equal(actual, expected, what):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a.ravel() != e.ravel())
        i = bad[0]
        raise AssertionError(f"{what}: {bad.size} of {a.size} elements differ; first at {i}: "
                             f"{np.asarray(actual).ravel()[i]!r} vs {np.asarray(expected).ravel()[i]!r}")


class Run:
    def __init__(self, world, ranks_per_node, node_reduce, root: Path):
        self.world, self.R, self.N, self.dir = world, ranks_per_node, world // ranks_per_node, root
        self.onebit = node_reduce == "1bit"
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMP_NUM_THREADS="1")
        cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", str(driver_path()), str(root),
               str(ranks_per_node), str(CALLS), str(SEED), ",".join(map(str, SIZES)), node_reduce]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"node_aware_driver -np {world} R={ranks_per_node} failed:\n" \
                                     f"{proc.stdout}{proc.stderr}"

    def array(self, rank, t, kind):
        return np.load(self.dir / f"r{rank}_t{t}_{kind}.npy")

    def bytes(self, rank):
        """[(node, rail, world)] per call."""
        lines = (self.dir / f"r{rank}_bytes.txt").read_text().splitlines()
        return [tuple(int(v) for v in line.split()) for line in lines]

    def topology(self, rank):
        out = {}
        for line in (self.dir / f"r{rank}_topology.txt").read_text().splitlines():
            key, *values = line.split()
            out[key] = values
        return out


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=lambda pr: f"P{pr[0]}_R{pr[1]}_{pr[2]}")
def run(request, tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if not driver_path().exists():
        pytest.skip(f"{driver_path()} not built (set DSOPT_NODE_AWARE_DRIVER or DSOPT_LIBRARY_DIR)")
    P, R, node_reduce = request.param
    return Run(P, R, node_reduce, tmp_path_factory.mktemp(f"node_aware_P{P}_R{R}_{node_reduce}"))


def test_outputs_and_errors_match_the_reference_bit_for_bit(run):
    P, N, R = run.world, run.N, run.R
    for t, n in enumerate(SIZES):
        ref = NodeAwareReference(n, N, R, run.onebit)
        inputs = [run.array(r, t, "in") for r in range(P)]
        outs = [run.array(r, t, "out") for r in range(P)]
        ews = [run.array(r, t, "ew") for r in range(P)]
        ess = [run.array(r, t, "es") for r in range(P)]
        ens = [run.array(r, t, "en") for r in range(P)] if ref.onebit else None
        npp = padded_length(slice_length(n, R, ref.onebit), N)
        for r in range(P):
            assert ews[r].shape == (CALLS, npp), f"tensor {t} (n={n}): worker error length"
            assert ess[r].shape == (CALLS, npp // N), f"tensor {t} (n={n}): server error length"
        for k in range(CALLS):
            expected, _ = ref.run([inputs[r][k] for r in range(P)])
            for r in range(P):
                at = f"{N} x {R}, tensor {t} (n={n}), rank {r}, call {k}"
                assert_bits_equal(outs[r][k], expected, f"output, {at}")
                assert_bits_equal(ews[r][k], ref.worker_error(r), f"worker error, {at}")
                assert_bits_equal(ess[r][k], ref.server_error(r), f"server error, {at}")
                if ens:
                    assert_bits_equal(ens[r][k], ref.node_error(r), f"node worker error, {at}")


def test_every_rank_ends_with_the_same_bits(run):
    for t in range(len(SIZES)):
        out0 = run.array(0, t, "out")
        for r in range(1, run.world):
            assert_bits_equal(run.array(r, t, "out"), out0, f"tensor {t}, rank {r} vs rank 0")


def test_one_rank_per_node_is_the_flat_form_bit_for_bit(run):
    if run.R != 1:
        pytest.skip("only for R = 1")
    for t in range(len(SIZES)):
        for r in range(run.world):
            for kind in ("out", "ew", "es"):
                assert_bits_equal(run.array(r, t, kind), run.array(r, t, f"flat_{kind}"),
                                  f"{kind} of tensor {t}, rank {r}")


def test_one_node_averages_without_compression(run):
    if run.N != 1:
        pytest.skip("only for N = 1")
    for t in range(len(SIZES)):
        inputs = np.stack([run.array(r, t, "in") for r in range(run.world)])
        mean = inputs.astype(np.float64).mean(axis=0)
        out = run.array(0, t, "out")
        assert np.allclose(out, mean, rtol=1e-6, atol=1e-6), f"tensor {t}: not the node mean"
    for r in range(run.world):
        assert all(rail == 0 for _, rail, _ in run.bytes(r)), "one node sent bytes across nodes"


def test_bytes_across_nodes_follow_the_formula_and_fall_by_R(run):
    P, N, R = run.world, run.N, run.R
    cross = rail_bytes(SIZES, N, R, run.onebit)
    inside = node_bytes(SIZES, N, R, run.onebit)
    flat_all = flat_bytes(SIZES, P, P - 1)
    flat_cross = flat_bytes(SIZES, P, P - R)
    for r in range(P):
        library = [int(v) for v in (run.dir / f"r{r}_formulas.txt").read_text().split()]
        assert library == [inside, cross, flat_cross], "the library's byte formulas"
        for k, (node, rail, world) in enumerate(run.bytes(r)):
            at = f"rank {r}, call {k}"
            assert rail == cross, f"{at}: rail bytes {rail} != formula {cross}"
            assert node == inside, f"{at}: node bytes {node} != formula {inside}"
            assert world == flat_all, f"{at}: flat bytes {world} != formula {flat_all}"
    if N > 1 and R > 1:
        # The codes of each slice cross once per node instead of once per
        # rank: about 1/R of the flat form's cross-node bytes (less: the
        # rail's padding unit N lcm(N, 8) is smaller, and its R - 1 fewer
        # scale pairs per peer).
        ratio = cross / flat_cross
        assert ratio <= 1.0 / R, f"{N} x {R}: cross-node bytes {cross} vs flat {flat_cross}"
        big = [70001 * 64]
        big_ratio = rail_bytes(big, N, R, run.onebit) / flat_bytes(big, P, P - R)
        assert abs(big_ratio * R - 1) < 0.01, f"{N} x {R}: large tensor ratio {big_ratio}"


def test_topology_from_the_communicator_and_splits(run):
    P = run.world
    for r in range(P):
        topo = run.topology(r)
        # one machine: one node of P ranks
        assert topo["discover"] == ["1", str(P), "0", str(r), "-"], topo["discover"]
        # unequal node ids fall back to the flat topology, with a reason
        assert topo["unequal"] == [str(P), "1", str(r), "0", "flat"], topo["unequal"]
        # interleaved nodes (even ranks, odd ranks): numbered by lowest rank
        assert topo["interleaved"] == ["2", str(P // 2), str(r % 2), str(r // 2), "-"]
        node_sum = sum(q for q in range(P) if q % 2 == r % 2)
        rail_sum = sum(q for q in range(P) if q // 2 == r // 2)
        assert topo["interleaved_sums"] == [str(node_sum), str(rail_sum), "mpi"]
        einval, eunsupported = topo["status_codes"]
        assert topo["declared_bad"] == [einval]
        assert topo["local_split"] == ["1", "1", "local"]
        assert topo["custom_split"] == [eunsupported]
