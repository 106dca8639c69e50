"""dsopt over torch.distributed (dsopt.Communicator.from_torch, and
dsopt.torch.Optimizer on a process group): gloo ranks started with
torch.multiprocessing (torch_comm_worker.py) train a small model bit for bit
as the same ranks under mpirun with mpi4py do; a failing collective, groups
a rank is not in and ranks disagreeing on the group give errors, not hangs.

Needs torch; `make test-torch` runs this file (tests/python/run_torch_tests.sh)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import conftest  # noqa: E402
import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
import torch_comm_worker as worker  # noqa: E402
from dsopt_testing import mpi4py_missing  # noqa: E402

try:
    worker.digits()
except Exception as exc:  # noqa: BLE001
    pytest.skip(f"scikit-learn's digits data is not available to this Python ({exc}); on "
                f"Debian: apt-get install python3-sklearn", allow_module_level=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world, *args, timeout=120):
    """torch.multiprocessing (spawn) of fn(rank, world, port, *args) on
    `world` processes; fails the test when they do not all end in time."""
    mp = torch.multiprocessing
    context = mp.start_processes(fn, args=(world, free_port()) + args, nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=0.5):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"{fn.__name__} on {world} processes did not finish within {timeout} s")


def mpirun(world, out_dir, timeout=120):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
    cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", sys.executable,
           str(conftest.HERE / "torch_comm_worker.py"), "mpi", str(out_dir)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"mpirun -np {world} failed:\n{proc.stdout}{proc.stderr}"


def load(out_dir, launcher, world):
    runs = []
    for rank in range(world):
        with np.load(out_dir / f"{launcher}-rank{rank}.npz") as f:
            runs.append({key: f[key] for key in f.files})
    return runs


PARAM_NAMES = [(name, p.numel()) for name, p in worker.make_model().named_parameters()]


def first_difference(a, b):
    """'step s, tensor NAME[i]: x vs y' for the first element where the
    per-step parameter snapshots a and b (steps x params) differ."""
    steps, where = np.nonzero(a.view(np.uint32) != b.view(np.uint32))
    step, flat_index = steps[0], where[steps == steps[0]][0]
    offset = 0
    for name, n in PARAM_NAMES:
        if flat_index < offset + n:
            break
        offset += n
    count = int(np.count_nonzero(a[step].view(np.uint32) != b[step].view(np.uint32)))
    return (f"step {step + 1}, tensor {name}[{flat_index - offset}]: {a[step, flat_index]!r} vs "
            f"{b[step, flat_index]!r} ({count} elements differ at that step)")


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def runs(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"torch_comm_{world}")
    spawn(worker.train_main, world, str(out))
    result = {"world": world, "spawn": load(out, "spawn", world), "mpi": None,
              "mpi_missing": mpi4py_missing()}
    if not result["mpi_missing"]:
        mpirun(world, out)
        result["mpi"] = load(out, "mpi", world)
    return result


@pytest.mark.parametrize("name", list(worker.CONFIGS))
def test_gloo_ranks_train_and_agree(runs, name):
    ranks = runs["spawn"]
    for rank, run in enumerate(ranks[1:], 1):
        a, b = ranks[0][f"{name}.params"], run[f"{name}.params"]
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
            f"rank {rank} differs from rank 0 at {first_difference(a, b)}"
    losses = np.mean([run[f"{name}.loss"] for run in ranks], axis=0)
    assert losses[-4:].mean() < 0.6 * losses[:4].mean(), losses
    compressed = ranks[0][f"{name}.compressed"]
    if name == "OneBitAdam":
        assert not compressed[:7].any() and compressed[8:].all(), compressed
    assert (ranks[0][f"{name}.bytes_sent"] > 0).all()


@pytest.mark.parametrize("name", list(worker.CONFIGS))
def test_gloo_run_is_bit_identical_to_the_mpi_run(runs, name):
    if runs["mpi"] is None:
        pytest.skip(runs["mpi_missing"])
    for rank, (ours, theirs) in enumerate(zip(runs["spawn"], runs["mpi"])):
        a, b = ours[f"{name}.params"], theirs[f"{name}.params"]
        assert a.shape == b.shape
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), \
            f"{name}, {runs['world']} ranks, rank {rank}: gloo and MPI differ at " \
            f"{first_difference(a, b)}"
        np.testing.assert_array_equal(ours[f"{name}.loss"], theirs[f"{name}.loss"])
        np.testing.assert_array_equal(ours[f"{name}.compressed"], theirs[f"{name}.compressed"])
        np.testing.assert_array_equal(ours[f"{name}.bytes_sent"], theirs[f"{name}.bytes_sent"],
                                      err_msg=f"{name} rank {rank}: bytes_sent per step")


# ---- errors (one launch of 4 ranks) -------------------------------------------------


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch_comm_errors")
    world = 4
    barrier = torch.multiprocessing.get_context("spawn").Barrier(world, timeout=60)
    started = time.monotonic()
    spawn(worker.errors_main, world, str(out), barrier, timeout=120)
    reports = [json.loads((out / f"errors-rank{r}.json").read_text()) for r in range(world)]
    for rank, report in enumerate(reports):
        assert "crash" not in report, f"rank {rank}:\n{report['crash']}"
        assert report.get("finished"), f"rank {rank} did not finish: {report}"
    return reports, time.monotonic() - started


def test_torch_collectives_and_their_fallbacks_match_numpy(errors):
    reports, _ = errors
    for rank, report in enumerate(reports):
        assert report["collectives"]["problems"] == [], f"rank {rank}"


def test_a_communicator_on_another_cuda_device_is_refused_by_name(errors):
    reports, _ = errors
    for rank, report in enumerate(reports):
        outcome = report["device_binding"]
        assert outcome["kind"] == "TorchCollectives" and outcome["device"] is None, outcome
        assert outcome["other"] is not None, f"rank {rank}: cuda:0 parameters were accepted"
        assert "works on cuda:1" in outcome["other"] and "on cuda:0" in outcome["other"]
        assert outcome["after"] == "cuda:1", outcome


def test_group_this_rank_is_not_in_is_a_clear_error(errors):
    reports, _ = errors
    for rank, report in enumerate(reports):
        outcome = report["non_member"]
        for what in ("from_torch", "optimizer"):
            assert outcome[what] is not None, f"rank {rank}: {what} accepted a foreign group"
            assert outcome[what]["type"] == "ValueError", outcome[what]
            assert "not a member of the process group" in outcome[what]["message"]
        assert outcome["not_a_group"]["type"] == "TypeError"
        assert "ProcessGroup" in outcome["not_a_group"]["message"]


def test_disjoint_pairs_train_independently(errors):
    reports, _ = errors
    params = [report["pairs"]["params"] for report in reports]
    assert params[0] == params[1] and params[2] == params[3]


def test_a_raising_callback_fails_every_rank_and_nobody_hangs(errors):
    reports, seconds = errors
    for rank, report in enumerate(reports):
        assert report["fault_step0"] is None and report["fault_step1"] is None, report
        failed = report["fault_step2"]
        assert failed is not None, f"rank {rank}: the step after the failure did not raise"
        assert failed["type"] == "CommError", failed
        if rank == 0:
            assert "injected failure in" in failed["message"] and "on rank 0" in failed["message"]
            assert failed["cause"]["type"] == "RuntimeError"
            assert failed["seconds"] < 2, failed
        else:
            # gloo gave up waiting for rank 0 (or saw it leave the collective)
            assert failed["cause"] is not None, failed
            assert failed["seconds"] < 3 + 10, failed
    assert seconds < 110


def test_ranks_disagreeing_on_the_group_fail_instead_of_hanging(errors):
    """Ranks 0 and 1 step on their pair's group; ranks 2 and 3 on a group of
    all four, which 0 and 1 never use: 2 and 3 raise when its timeout
    expires."""
    reports, _ = errors
    assert reports[0]["mismatch"] is None and reports[1]["mismatch"] is None
    for rank in (2, 3):
        failed = reports[rank]["mismatch"]
        assert failed is not None and failed["type"] == "CommError", failed
        assert failed["seconds"] < 3 + 10, failed


# ---- one process ------------------------------------------------------------------------


def test_from_torch_without_torch_distributed_initialised_is_a_clear_error():
    assert not torch.distributed.is_initialized()
    with pytest.raises(RuntimeError, match="not initialised.*init_process_group"):
        dsopt.Communicator.from_torch()


def test_optimizer_without_torch_distributed_runs_on_one_process():
    model = worker.make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), worker.CONFIGS["AdamW"])
    assert opt._comm is None and opt.dsopt.communicator.kind == "local"
    opt.close()


def test_a_closed_communicator_keeps_no_process_group_alive():
    """After close(), neither the dsopt.Communicator of from_torch nor its
    TorchCollectives refers to the process group, even while garbage
    cycles keep them (an optimizer's): the group goes with
    destroy_process_group(), not at interpreter exit."""
    import gc

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{conftest.free_port()}",
                            rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        model = worker.make_model()
        opt = dsopt.torch.AdamW(model.parameters(), overlap=True)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        comm = opt.dsopt.communicator
        collectives = comm.torch_collectives
        assert comm.kind == "torch" and comm.group is group and collectives.group is group
        opt.close()
        cycle = [opt, comm, collectives]
        cycle.append(cycle)  # garbage that outlives the optimizer, as hooks make it
        del opt, cycle
        holders = [type(r).__name__ for r in gc.get_referrers(group)
                   if isinstance(r, (dsopt.Communicator, type(collectives)))]
        assert holders == [], f"closed dsopt objects still hold the process group: {holders}"
        assert comm.closed and comm.group is None and comm.torch_collectives is None
        assert collectives.group is None
        gc.collect()
    finally:
        dist.destroy_process_group()


def test_torch_buffers_of_from_callbacks_wrap_dsopt_memory():
    """buffers="torch" on one rank: CPU tensors on dsopt's memory."""
    seen = []

    def copy(send, recv, *op):
        seen.append((type(send), send.dtype, send.device.type))
        recv.copy_(send)

    ops = {name: copy for name in ("allreduce", "reduce_scatter", "allgather", "alltoall")}
    model, reference = worker.make_model(), worker.make_model()
    with dsopt.Communicator.from_callbacks(0, 1, buffers="torch", **ops) as comm:
        for m, c in ((model, comm), (reference, None)):
            opt = dsopt.torch.Optimizer(m.parameters(), worker.CONFIGS["OneBitAdam"], comm=c)
            x, y = worker.digits()
            for step in range(10):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(m(x[step:step + 8]), y[step:step + 8]).backward()
                opt.step()
            opt.close()
    for a, b in zip(model.parameters(), reference.parameters()):
        assert torch.equal(a, b)
    assert all(t is torch.Tensor and d == "cpu" for t, _, d in seen)
