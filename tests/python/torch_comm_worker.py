"""The ranks of test_torch_comm.py: dsopt.torch over torch.distributed (gloo,
launched with torch.multiprocessing) and the same training under mpirun
(mpi4py).

* ``train``: a small MLP on scikit-learn's digits, each rank on its own
  shard of every global batch, with dsopt.torch AdamW (``comm=None``: the
  default process group) and 1-bit Adam (``comm=`` a ProcessGroup,
  ``overlap=True``: with torch >= 2.1 the gradients are handed over from
  backward's hooks, so dsopt's collectives run inside backward); every
  rank saves its parameters after every step, bytes sent and compressed
  flags to ``<launcher>-rank<r>.npz``. Under ``mpirun`` (``python3
  torch_comm_worker.py mpi OUT_DIR``) the same runs use ``comm=`` mpi4py's
  COMM_WORLD.
* ``errors`` (4 ranks): the collectives of TorchCollectives checked against
  numpy, groups a rank is not a member of, two disjoint pairs training at
  once, a callback raising on rank 0, and ranks disagreeing on the group;
  each rank writes what happened to ``errors-rank<r>.json``.
"""

import datetime
import json
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
for path in (REPO / "bindings" / "python", REPO / "examples" / "python", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

STEPS = 24
BATCH = 64  # global; each of the ranks gets BATCH // world of it
CONFIGS = {
    "AdamW": {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
              "threads": 1},
    "OneBitAdam": {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 8}},
                   "threads": 1},
}
OVERLAP = {"OneBitAdam"}  # runs with overlap=True


def digits():
    """(x, y) tensors: the training part of scikit-learn's digits."""
    from small_models import load_digits_split

    data = load_digits_split()
    return torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def train(name, comm, rank, world, data, steps=STEPS):
    """{key: array} of one run: parameters after every step, this rank's
    loss, bytes sent and compressed flag per step."""
    x, y = data
    model = make_model()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "dsopt.torch.Optimizer.overlap=True. needs torch",
                                RuntimeWarning)
        opt = dsopt.torch.Optimizer(model.parameters(), CONFIGS[name], comm=comm,
                                    overlap=name in OVERLAP)
    draw = np.random.RandomState(1)
    local = BATCH // world
    out = {"params": [], "bytes_sent": [], "compressed": [], "loss": []}
    try:
        for _ in range(steps):
            batch = draw.choice(len(y), BATCH, replace=False)
            idx = torch.from_numpy(batch[rank * local:(rank + 1) * local])
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            info = opt.last_step_info
            out["params"].append(flat(model))
            out["bytes_sent"].append(info.bytes_sent)
            out["compressed"].append(info.compressed)
            out["loss"].append(float(loss))
        comm_used = opt._comm
        out["fallbacks"] = ",".join(sorted(getattr(
            comm_used._borrowed[0], "fallbacks", ()))) if comm_used is not None and \
            comm_used.kind == "torch" else ""
    finally:
        opt.close()
    return {k: np.array(v) for k, v in out.items()}


def save_runs(out_dir, launcher, rank, runs):
    arrays = {f"{name}.{key}": value for name, run in runs.items() for key, value in run.items()}
    np.savez(Path(out_dir) / f"{launcher}-rank{rank}.npz", **arrays)


def init_gloo(rank, world, port, timeout_s):
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s))


# ---- spawn entry points (torch.multiprocessing passes the rank first) ---------------


def train_main(rank, world, port, out_dir):
    torch.set_num_threads(1)
    init_gloo(rank, world, port, 60)
    dist = torch.distributed
    data = digits()
    runs = {"AdamW": train("AdamW", None, rank, world, data)}  # the default group
    group = dist.new_group(list(range(world)))
    runs["OneBitAdam"] = train("OneBitAdam", group, rank, world, data)
    save_runs(out_dir, "spawn", rank, runs)
    dist.barrier()
    # What is tested is done; gloo's teardown at exit is not part of it.
    os._exit(0)


def mpi_main(out_dir):
    from mpi4py import MPI

    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    data = digits()
    runs = {name: train(name, world, world.Get_rank(), world.Get_size(), data) for name in CONFIGS}
    save_runs(out_dir, "mpi", world.Get_rank(), runs)


# ---- errors ---------------------------------------------------------------------------

SHORT = datetime.timedelta(seconds=3)  # the timeout of the groups that see failures


def describe(error):
    return {"type": type(error).__name__, "message": str(error)}


def dsopt_view(coll, tensor, writable):
    """``tensor`` as a collective callback receives it from dsopt: wrapped
    from its address by the communicator's ``buffer`` (a send buffer is
    not writable)."""
    from dsopt._callback_comm import ELEM_DTYPES
    from dsopt._lib import ffi, lib

    elem = next(code for code, dtype in ELEM_DTYPES.items()
                if dtype == torch.empty(0, dtype=tensor.dtype).numpy().dtype)
    where = lib.DSOPT_COMM_CUDA if tensor.is_cuda else lib.DSOPT_COMM_HOST
    stream = torch.cuda.current_stream(tensor.device).cuda_stream if tensor.is_cuda else 0
    return coll.buffer(ffi.cast("void *", tensor.data_ptr()), tensor.numel(), elem, where,
                       writable, stream)


def check_collectives(group, rank, world, device="cpu"):
    """TorchCollectives' four collectives (native, then with every
    fallback) on every dtype, on buffers of ``device`` wrapped as dsopt's
    callbacks wrap them (read-only send buffers), against the expected
    values; a list of what differed, and the fallbacks the backend needed."""
    from dsopt._torch_comm import TorchCollectives

    problems = []
    count = 5
    device = torch.device(device)
    for forced in (False, True):
        coll = TorchCollectives(group)
        if forced:
            coll.fallbacks.update({"allgather", "reduce_scatter", "alltoall"})
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
            def data(r, n):
                return (torch.arange(n, dtype=torch.int64) * 7 + 3 * r + 1).remainder(50).to(dtype)

            def empty(n):
                return torch.full((n,), 99, dtype=dtype, device=device)

            everyone = [data(r, world * count) for r in range(world)]
            mine = everyone[rank].to(device)
            send = dsopt_view(coll, mine, False)
            total, top = sum(t.to(torch.float64) for t in everyone), torch.stack(everyone).amax(0)
            checks = []
            recv = empty(world * count)
            coll.allreduce(send, dsopt_view(coll, recv, True), "sum")
            checks.append(("allreduce sum", recv, total.to(dtype)))
            inplace = mine.clone()
            both = dsopt_view(coll, inplace, True)
            coll.allreduce(both, both, "max")
            checks.append(("allreduce max in place", inplace, top))
            block = slice(rank * count, (rank + 1) * count)
            for op, want in (("sum", total.to(dtype)[block]), ("max", top[block])):
                recv = empty(count)
                coll.reduce_scatter(send, dsopt_view(coll, recv, True), op)
                checks.append((f"reduce_scatter {op}", recv, want))
            recv = empty(world * count)
            coll.allgather(dsopt_view(coll, mine[:count], False), dsopt_view(coll, recv, True))
            checks.append(("allgather", recv, torch.cat([t[:count] for t in everyone])))
            recv = empty(world * count)
            coll.alltoall(send, dsopt_view(coll, recv, True))
            checks.append(("alltoall", recv, torch.cat([t[block] for t in everyone])))
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if not torch.equal(mine.cpu(), everyone[rank]):
                problems.append(f"a collective wrote to its send buffer ({dtype}, "
                                f"forced={forced})")
            for what, got, want in checks:
                if not torch.equal(got.cpu(), want.to(dtype)):
                    problems.append(f"{what} {dtype} {device} forced={forced}: "
                                    f"{got.tolist()} != {want.tolist()}")
        if not forced:
            native_fallbacks = sorted(coll.fallbacks)
    return problems, native_fallbacks


def check_device_binding(group):
    """What a from_torch communicator says to parameters on its own CUDA
    device and on another (only torch.device values are compared: no GPU
    is needed)."""
    comm = dsopt.Communicator.from_torch(group)
    try:
        coll = comm.torch_collectives
        outcome = {"kind": type(coll).__name__, "device": None if coll.device is None
                   else str(coll.device)}
        coll.device = torch.device("cuda", 1)  # as if its stream were on cuda:1
        coll.bind_device(torch.device("cuda", 1))
        try:
            coll.bind_device(torch.device("cuda", 0))
            outcome["other"] = None
        except ValueError as error:
            outcome["other"] = str(error)
        outcome["after"] = str(coll.device)
    finally:
        comm.close()
    return outcome


class FailingCollectives:
    """TorchCollectives whose next collective raises once ``armed``."""

    def __init__(self, group):
        from dsopt._torch_comm import TorchCollectives

        self.inner = TorchCollectives(group)
        self.armed = False

    def callbacks(self):
        def wrap(name):
            inner = self.inner.callbacks()[name]

            def call(*args):
                if self.armed:
                    raise RuntimeError(f"injected failure in {name} on rank {self.inner.rank}")
                return inner(*args)
            return call

        return {name: wrap(name) for name in ("allreduce", "reduce_scatter", "allgather",
                                              "alltoall")}


def errors_main(rank, world, port, out_dir, barrier):
    torch.set_num_threads(1)
    report = {}
    path = Path(out_dir) / f"errors-rank{rank}.json"

    def save():
        path.write_text(json.dumps(report))

    try:
        init_gloo(rank, world, port, 60)
        dist = torch.distributed
        data = digits()
        # every group is created by every rank, in the same order
        pairs = [dist.new_group([0, 1], timeout=SHORT), dist.new_group([2, 3], timeout=SHORT)]
        everyone = dist.new_group(list(range(world)))
        faulty = dist.new_group(list(range(world)), timeout=SHORT)
        mismatched = dist.new_group(list(range(world)), timeout=SHORT)
        mine, other = pairs[rank // 2], pairs[1 - rank // 2]

        problems, fallbacks = check_collectives(everyone, rank, world)
        report["collectives"] = {"problems": problems, "fallbacks": fallbacks}
        report["device_binding"] = check_device_binding(everyone)
        save()

        outcome = {}
        for what, make in (("from_torch", lambda: dsopt.Communicator.from_torch(other)),
                           ("optimizer", lambda: dsopt.torch.Optimizer(
                               make_model().parameters(), CONFIGS["AdamW"], comm=other)),
                           ("not_a_group", lambda: dsopt.Communicator.from_torch("world"))):
            try:
                make()
                outcome[what] = None
            except Exception as error:  # noqa: BLE001 - reported
                outcome[what] = describe(error)
        report["non_member"] = outcome
        save()

        run = train("AdamW", mine, rank % 2, 2, data, steps=6)
        report["pairs"] = {"params": run["params"][-1].tobytes().hex()}
        save()
        barrier.wait()

        failing = FailingCollectives(faulty)
        comm = dsopt.Communicator.from_callbacks(
            failing.inner.rank, failing.inner.size, **failing.callbacks(), buffers="torch")
        model = make_model()
        opt = dsopt.torch.Optimizer(model.parameters(), CONFIGS["AdamW"], comm=comm)
        x, y = data
        for step in range(3):
            if step == 2 and rank == 0:
                failing.armed = True
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[:16]), y[:16]).backward()
            start = time.monotonic()
            try:
                opt.step()
                report[f"fault_step{step}"] = None
            except Exception as error:  # noqa: BLE001 - reported
                report[f"fault_step{step}"] = dict(
                    describe(error), seconds=time.monotonic() - start,
                    cause=describe(comm.callback_error) if comm.callback_error else None)
                break
        opt.close()
        comm.close()
        save()
        barrier.wait()  # rank 0 stays until its peers have timed out

        start = time.monotonic()
        try:
            run = train("AdamW", mine if rank < 2 else mismatched, rank, 2 if rank < 2 else world,
                        data, steps=3)
            report["mismatch"] = None
        except Exception as error:  # noqa: BLE001 - reported
            report["mismatch"] = dict(describe(error), seconds=time.monotonic() - start)
        save()
        barrier.wait()
        report["finished"] = True
    except Exception:  # noqa: BLE001 - reported to the test
        report["crash"] = traceback.format_exc()
        barrier.abort()
    save()
    os._exit(0)  # skip tearing down gloo groups whose peers timed out


if __name__ == "__main__":
    if sys.argv[1:2] == ["mpi"]:
        mpi_main(sys.argv[2])
    else:
        sys.exit("usage: torch_comm_worker.py mpi OUT_DIR")
