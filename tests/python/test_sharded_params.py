"""dsopt_comm_set_shards: optimizers on sharded parameters (the C library
under FSDP; docs/reference/c-api.md "Sharded parameters"), at 2 and 4 ranks
under mpirun (mpi_sharded_params.py says what each phase checks), and the
one-process rules of the call; DSOPT_LOAD_WITHOUT_RANK_LOCAL, with which
dsopt.torch's FSDP2 state dicts load at another topology."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_sharded_params.py")


def _need_mpi():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")


def test_two_ranks_update_their_shards_as_whole_tensors_and_agree_on_every_step(tmp_path):
    _need_mpi()
    mpi_runner.mpirun(SCRIPT, 2, tmp_path, ["whole", "agree"])


def test_a_blob_without_rank_local_state_loads_and_resets_it(tmp_path):
    """DSOPT_LOAD_WITHOUT_RANK_LOCAL (what the FSDP2 state dicts load at
    another topology with)."""
    _need_mpi()
    mpi_runner.mpirun(SCRIPT, 2, tmp_path, ["without"])


def test_replicas_of_shards_run_the_one_bit_optimizers_over_the_replicas(tmp_path):
    _need_mpi()
    mpi_runner.mpirun(SCRIPT, 4, tmp_path, ["hsdp"])


def test_shards_of_one_rank_change_nothing():
    """A shard communicator of one rank is no shard group: an empty
    parameter is still refused, and the steps are a local optimizer's."""
    comm, shards = dsopt.Communicator.local(), dsopt.Communicator.local()
    comm.set_shards(shards)
    assert comm.shards is shards
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    with pytest.raises(dsopt.InvalidArgument, match=r"params\[1\]\.numel must be > 0"):
        dsopt.Optimizer(config, [np.ones(3, np.float32), np.ones(0, np.float32)], comm=comm)
    p, q = np.arange(4, dtype=np.float32), np.arange(4, dtype=np.float32)
    with dsopt.Optimizer(config, [p], comm=comm) as opt, dsopt.Optimizer(config, [q]) as plain:
        g = np.linspace(-1, 1, 4).astype(np.float32)
        opt.step([g])
        plain.step([g])
    assert np.array_equal(p, q)
    comm.set_shards(None)
    assert comm.shards is None
    comm.close()
    shards.close()


def test_set_shards_rejects_the_communicator_itself():
    comm = dsopt.Communicator.local()
    with pytest.raises(dsopt.InvalidArgument, match="another communicator"):
        comm.set_shards(comm)
    with pytest.raises(dsopt.InvalidArgumentType):
        comm.set_shards(object())
    comm.close()
