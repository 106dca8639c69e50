"""``Optimizer.grad_ready`` and ``step()`` (gradients handed over one
parameter at a time, dsopt_grad_ready) in the numpy binding: the phases of
mpi_grad_ready.py in this process (one rank) and under ``mpirun -np 4``
(every check is made on the ranks; a test here fails with that run's
traceback), and the binding's own argument handling."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_grad_ready as gr
import mpi_runner
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_grad_ready.py")
PHASES = ["order", "accumulation", "misuse"]


@pytest.fixture
def local():
    comm = dsopt.Communicator.local()
    yield comm
    comm.close()


def test_handed_over_gradients_step_bit_identically_to_step_at_once(local):
    assert gr.phase_order(local, 0, 1) == 4 * len(gr.STAGES)


def test_accumulated_micro_batches_step_with_their_mean(local):
    gr.phase_accumulation(local, 0, 1)


def test_misuse_raises_invalid_argument_and_changes_nothing(local):
    gr.phase_misuse(local, 0, 1)


@pytest.fixture(scope="module")
def mpi():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    pytest.importorskip("mpi4py", reason="mpi4py not installed (pip install mpi4py)")


@pytest.mark.parametrize("phase", PHASES)
def test_four_ranks(mpi, phase, tmp_path):
    """order: bit-identical to step(grads) at stages 0-2, each rank with
    its own order, some parameters left out on some ranks; accumulation:
    G=3 against float64 AdamW on the mean over 4 ranks x 3 micro-batches;
    misuse: rejected on every rank, nothing changes. mpi4py initialises MPI
    with MPI_THREAD_MULTIPLE, so the reductions run on dsopt's thread."""
    mpi_runner.mpirun(SCRIPT, 4, tmp_path, [phase], timeout=300)


# ---- the binding itself (one rank) ------------------------------------------------

def make(comm, config=None):
    params = [np.linspace(-1, 1, n, dtype=np.float32) for n in (5, 3)]
    config = config or {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    return dsopt.Optimizer(config, params, comm=comm), params


def test_index_may_be_any_integer_type(local):
    opt, params = make(local)
    ref, ref_params = make(local)
    grads = [np.full(5, 0.5, np.float32), np.full(3, -0.25, np.float32)]
    with opt, ref:
        opt.grad_ready(np.int64(1), grads[1])
        opt.grad_ready(np.uint8(0), grads[0])
        info = opt.step(None)
        assert info.step == 1 and not info.skipped
        ref.step(grads)
    for a, b in zip(params, ref_params):
        assert np.array_equal(a, b)


def test_bool_index_is_rejected(local):
    opt, _ = make(local)
    with opt:
        with pytest.raises(dsopt.InvalidArgumentType, match="bool"):
            opt.grad_ready(True, np.zeros(3, np.float32))


def test_closed_optimizer_raises(local):
    opt, _ = make(local)
    opt.close()
    with pytest.raises(ValueError, match="closed"):
        opt.grad_ready(0, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="closed"):
        opt.step()


def test_skipped_step_reports_a_non_finite_handed_over_gradient(local):
    opt, params = make(local)
    before = [p.copy() for p in params]
    with opt:
        bad = np.zeros(5, np.float32)
        bad[2] = np.inf
        opt.grad_ready(0, bad)
        opt.grad_ready(1, np.ones(3, np.float32))
        info = opt.step()
        assert info.skipped and info.step == 0 and info.consecutive_skips == 1
        for a, b in zip(params, before):
            assert np.array_equal(a, b)
        opt.grad_ready(1, np.ones(3, np.float32))
        opt.grad_ready(0, np.ones(5, np.float32))
        assert opt.step().step == 1
