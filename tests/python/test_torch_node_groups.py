"""The node-aware compressed collectives over torch.distributed (gloo, 4
processes as 2 nodes of 2 declared by "ranks_per_node"; torch_node_groups_worker.py):

* ``Communicator.from_torch()`` given node and rail groups
  (``Communicator.set_nodes``, groups made by dsopt.torch's ``node_groups``):
  1-bit Adam, 1-bit LAMB and 0/1 Adam equal the node-aware numpy reference
  bit for bit on every rank, as under MPI (test_node_aware_onebit.py);
* ``dsopt.torch.Optimizer`` with "hierarchy": "node_aware" makes the groups
  itself: the ranks agree, and the compressed steps send at most 0.55 of
  the flat form's bytes to other nodes; with "flat" it makes none;
* node and rail groups that do not fit are refused on every rank.

Needs torch; tests/python/run_torch_tests.sh runs this file."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed for this Python")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import onebit_runs  # noqa: E402
import torch_node_groups_worker as worker  # noqa: E402
from mpi_node_aware_onebit import OPTIMIZERS  # noqa: E402
from test_node_aware_onebit import ref_params, reference, reference_state  # noqa: E402
from test_onebit_adam import assert_same_bits  # noqa: E402
from test_torch_comm import spawn  # noqa: E402

WORLD = 4


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torch_node_groups")
    spawn(worker.reference_main, WORLD, str(folder), timeout=300)
    spawn(worker.torch_main, WORLD, str(folder), timeout=300)
    return folder


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
def test_torch_groups_match_the_node_aware_reference(opt, out):
    runs, _, names, _ = OPTIMIZERS[opt]
    sc = runs.BY_NAME[names[0]]
    ref, _ = reference(opt, names[0], WORLD)
    for r in range(WORLD):
        params, _, blobs = onebit_runs.load_npz(out / f"{opt}-rank{r}.npz", len(sc.sizes))
        for i, (p, e) in enumerate(zip(params, ref_params(opt, ref, r))):
            assert_same_bits(p, e, f"{opt} rank {r}: param {i}")
        blob = onebit_runs.parse_blob(blobs["blob"])
        for section, want in reference_state(opt, ref, r).items():
            assert_same_bits(blob.floats(section), want, f"{opt} rank {r}: {section}")


def test_dsopt_torch_makes_the_node_groups_where_the_config_asks(out):
    runs = {h: [np.load(out / f"torch-{h}-rank{r}.npz") for r in range(WORLD)] for h in ("node_aware", "flat")}
    assert all(bool(f["made"]) for f in runs["node_aware"])
    assert not any(bool(f["made"]) for f in runs["flat"])
    for h, files in runs.items():
        for f in files[1:]:
            assert np.array_equal(f["params"].view(np.uint32), files[0]["params"].view(np.uint32)), h
    for na, flat in zip(runs["node_aware"], runs["flat"]):
        rows, flat_rows = na["rows"], flat["rows"]
        compressed = rows[:, 0] == 1
        assert compressed.any() and np.array_equal(compressed, flat_rows[:, 0] == 1)
        assert np.all(rows[compressed, 2] <= 0.55 * flat_rows[compressed, 2])
        assert np.array_equal(rows[~compressed], flat_rows[~compressed])


def test_node_and_rail_that_do_not_fit_are_refused_on_every_rank(out):
    """The node group given as rail group too (sizes fit, members do not:
    two ranks are the same place of the grid): dsopt_create fails with
    DSOPT_EINVAL on every rank, naming dsopt_comm_set_nodes."""
    assert [(out / f"swapped-rank{r}.txt").read_text() for r in range(WORLD)] == ["refused"] * WORLD
