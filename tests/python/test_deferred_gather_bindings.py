"""dsopt.Optimizer's calls of the deferred parameter allgather
(``"deferred_allgather"``): at one rank nothing is gathered (no buckets,
the waits return at once); at 2 ranks under mpirun (mpi4py, so
MPI_THREAD_MULTIPLE) the parameters after ``wait_gather`` are those of a
run without the key, bucket by bucket and parameter by parameter, in
parameter order and in an order given with ``set_gather_order``."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner

HERE = Path(__file__).resolve().parent


def config(deferred, stage=2):
    return {"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
            "zero_optimization": {"stage": stage, "allgather_bucket_size": 64,
                                  "deferred_allgather": deferred}}


def test_one_rank_has_no_buckets_and_the_waits_return():
    params = [np.linspace(-1, 1, 100, dtype=np.float32), np.ones(30, np.float32)]
    opt = dsopt.Optimizer(config(True), params)
    assert opt.gather_buckets == 0
    assert opt.gather_bucket_of(0) == -1 and opt.gather_bucket_of(1) == -1
    opt.step([np.full(100, 0.5, np.float32), np.full(30, -0.5, np.float32)])
    assert opt.gathers_pending() == 0
    opt.wait_gather(0)
    opt.wait_gather()
    opt.wait_gather_bucket()
    with pytest.raises(dsopt.InvalidArgument):
        opt.wait_gather(2)
    with pytest.raises(dsopt.InvalidArgument):
        opt.gather_bucket_of(-1)
    assert opt.config["zero_optimization"]["deferred_allgather"] is True
    opt.close()


def test_one_rank_checks_a_gather_order_which_changes_nothing():
    params = [np.linspace(-1, 1, 100, dtype=np.float32), np.ones(30, np.float32)]
    plain = [p.copy() for p in params]
    opt = dsopt.Optimizer(config(True), params)
    ref = dsopt.Optimizer(config(True), plain)
    opt.set_gather_order([1, 0])
    for bad in ([0], [0, 0], [0, 2], [1, 0, 2]):
        with pytest.raises(dsopt.InvalidArgument, match="dsopt_gather_order"):
            opt.set_gather_order(bad)
    with pytest.raises(TypeError):
        opt.set_gather_order(["a", 0])
    assert opt.gather_bucket_of(0) == -1 and opt.gather_bucket_of(1) == -1
    grads = [np.full(100, 0.5, np.float32), np.full(30, -0.5, np.float32)]
    opt.step(grads)
    ref.step(grads)
    opt.set_gather_order(None)
    assert all(np.array_equal(x, y) for x, y in zip(opt.params, ref.params))
    assert opt.state_dict() == ref.state_dict()
    opt.close()
    ref.close()


def test_two_ranks_match_the_run_without_deferral(tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    pytest.importorskip("mpi4py", reason="the worker needs MPI_THREAD_MULTIPLE (mpi4py)")
    mpi_runner.mpirun(HERE / "mpi_deferred_gather.py", 2, tmp_path, ["deferred"], timeout=300)
