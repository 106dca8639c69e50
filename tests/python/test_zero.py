"""ZeRO stage 1 and 2 (docs/guides/zero.md "ZeRO"): stage 1/2 against stage-0 data
parallelism on 1, 2, 3 and 4 ranks under mpirun (mpi_zero.py makes every
check on the ranks; a test here fails with that run's traceback), resume,
resharding 2 -> 4, 4 -> 2 and 4 -> 3 (from stage 2 and from stage 0, into
stage 0, 1 and 2), rejected blob sets, memory accounting; and the config
rules in one process."""

import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner
import zero_runs as zr
from dsopt_testing import build_feature

SCRIPT = Path(__file__).with_name("mpi_zero.py")
PHASES = ["equivalence", "resume", "memory", "bad_blobs", "save"]


def mpirun(world, results, phases, load_from=None):
    env = {} if load_from is None else {"DSOPT_ZERO_LOAD_FROM": str(load_from)}
    return mpi_runner.mpirun(SCRIPT, world, results, phases, env, timeout=600)


@pytest.fixture(scope="module")
def saved_runs(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    return {}


def run_world(saved_runs, tmp_path_factory, world):
    if world not in saved_runs:
        saved_runs[world] = mpirun(world, tmp_path_factory.mktemp(f"zero_P{world}"), PHASES)
    return saved_runs[world]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_stage_1_and_2_match_stage_0_resume_and_reject_bad_blobs(world, saved_runs, tmp_path_factory):
    folder = run_world(saved_runs, tmp_path_factory, world)
    lines = (folder / "rank0.txt").read_text().splitlines()
    assert f"equivalence OK {2 * len(zr.SCENARIOS)}" in lines


@pytest.mark.parametrize("old,new", [(2, 4), (4, 2), (4, 3)])
def test_resharding_continues_as_an_uninterrupted_run(old, new, saved_runs, tmp_path_factory):
    src = run_world(saved_runs, tmp_path_factory, old)
    mpirun(new, tmp_path_factory.mktemp(f"zero_{old}to{new}"), ["reshard"], load_from=src)


# ---- one process ------------------------------------------------------------

def make(zero, opt_type="AdamW", sizes=(5, 3)):
    params = [np.linspace(-1, 1, n, dtype=np.float32) for n in sizes]
    config = {"optimizer": {"type": opt_type, "params": {"lr": 1e-3}},
              "zero_optimization": zero}
    return dsopt.Optimizer(config, params), params


@pytest.mark.parametrize("opt_type", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam"])
def test_zero_with_a_one_bit_optimizer_is_unsupported(opt_type):
    with pytest.raises(dsopt.Unsupported, match="shard the state of .*AdamW"):
        make({"stage": 2}, opt_type)


@pytest.mark.parametrize("zero,error,pattern", [
    ({"stage": 3}, dsopt.InvalidArgument, "stage 3"),
    ({"stage": 2, "reduce_bucket_size": 0}, dsopt.InvalidArgument, "reduce_bucket_size"),
    ({"stage": 2, "allgather_bucket_size": -5}, dsopt.InvalidArgument, "allgather_bucket_size"),
    ({"stage": 2, "reduce_scatter": 1}, dsopt.InvalidArgument, "true or false"),
    ({"stage": 2, "contiguous_gradients": False}, dsopt.Unsupported, "contiguous"),
    ({"stage": 2, "round_robin_gradients": True}, dsopt.Unsupported, "round_robin"),
    ({"stage": 2, "offload_optimizer": {"device": "nvme"}}, dsopt.Unsupported, "NVMe"),
    ({"stage": 2, "offload_optimizer": {"device": "gpu"}}, dsopt.InvalidArgument, "cpu"),
    ({"stage": 0, "offload_optimizer": {"device": "cpu"}}, dsopt.InvalidArgument, "stage 1 or 2"),
    ({"stage": 2, "offload_optimiser": {}}, dsopt.InvalidArgument, "unknown key"),
    ({"stage": 2, "offload_param": {"device": "cpu"}}, dsopt.InvalidArgument, "unknown key"),
])
def test_bad_zero_config_is_rejected(zero, error, pattern):
    with pytest.raises(error, match=pattern):
        make(zero)


def test_deepspeed_keys_that_do_not_apply_are_accepted():
    zero = {"stage": 2, "overlap_comm": True, "allgather_partitions": True,
            "use_multi_rank_bucket_allreduce": False, "elastic_checkpoint": False,
            "load_from_fp32_weights": True, "ignore_unused_parameters": True,
            "contiguous_gradients": True, "reduce_scatter": True,
            "offload_optimizer": {"device": "none", "pin_memory": True}}
    opt, _ = make(zero)
    opt.close()


def test_cpu_offload_on_a_cpu_optimizer_changes_nothing():
    # The state already lives in host memory: same results, same memory.
    plain, p0 = make({"stage": 2, "reduce_bucket_size": 4}, sizes=(7, 5))
    offload, p1 = make({"stage": 2, "reduce_bucket_size": 4,
                        "offload_optimizer": {"device": "cpu", "pin_memory": True}}, sizes=(7, 5))
    rng = np.random.default_rng(5)
    with plain, offload:
        for _ in range(3):
            grads = [rng.standard_normal(n).astype(np.float32) for n in (7, 5)]
            plain.step(grads)
            offload.step(grads)
        for x, y in zip(p0, p1):
            assert np.array_equal(x, y)
        assert plain.memory_usage() == offload.memory_usage()
        assert plain.state_dict() == offload.state_dict()


def test_one_rank_zero_is_stage_0_and_reports_its_memory():
    opt0, p0 = make({"stage": 0}, sizes=(7, 5))
    opt2, p2 = make({"stage": 2, "reduce_bucket_size": 4}, sizes=(7, 5))
    rng = np.random.default_rng(3)
    with opt0, opt2:
        for _ in range(4):
            grads = [rng.standard_normal(n).astype(np.float32) for n in (7, 5)]
            a, b = opt0.step(grads), opt2.step(grads)
            assert (a.step, a.skipped, a.bytes_sent) == (b.step, b.skipped, b.bytes_sent) == (a.step, False, 0)
        for x, y in zip(p0, p2):
            assert np.array_equal(x, y)
        # fp32 parameters are their own masters: moments of n' = 12 elements
        # and the fp32 gradient shard.
        assert opt2.memory_usage() == {"host": 12 * 12, "device": 0}
        assert opt0.memory_usage() == {"host": 8 * 12, "device": 0}


def test_state_load_rejects_a_shard_of_another_layout_and_stage_0_blobs():
    opt0, _ = make({"stage": 0})
    opt2, _ = make({"stage": 2})
    opt2b, _ = make({"stage": 2, "reduce_bucket_size": 2})
    with opt0, opt2, opt2b:
        shard, replicated = opt2.state_dict(), opt0.state_dict()
        with pytest.raises(dsopt.Mismatch, match="load_shards"):
            opt0.load_state_dict(shard)
        with pytest.raises(dsopt.Mismatch, match="load_shards"):
            opt2.load_state_dict(replicated)
        with pytest.raises(dsopt.Mismatch, match="reduce bucket"):
            opt2b.load_state_dict(shard)
        # ... and load_state_dict_shards takes both, whatever the bucket size.
        for opt in (opt0, opt2, opt2b):
            opt.load_state_dict_shards([shard])
            opt.load_state_dict_shards([replicated])


def test_load_shards_checks_its_arguments():
    opt, _ = make({"stage": 2})
    with opt:
        with pytest.raises(dsopt.InvalidArgument):
            opt.load_state_dict_shards([])
        with pytest.raises(dsopt.InvalidArgument, match="bytes-like"):
            opt.load_state_dict_shards([object()])
        with pytest.raises(dsopt.CorruptState):
            opt.load_state_dict_shards([b"not a blob"])
