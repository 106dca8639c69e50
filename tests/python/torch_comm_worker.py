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


def check_collectives(group, rank, world):
    """TorchCollectives' four collectives (native, then with every
    fallback) on every dtype, against numpy; a list of what differed."""
    from dsopt._torch_comm import TorchCollectives

    problems = []
    count = 5
    for forced in (False, True):
        coll = TorchCollectives(group)
        if forced:
            coll.fallbacks.update({"allgather", "reduce_scatter", "alltoall"})
        for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
            def data(r, n):
                return (torch.arange(n, dtype=torch.int64) * 7 + 3 * r + 1).remainder(50).to(dtype)

            everyone = [data(r, world * count) for r in range(world)]
            send = everyone[rank].clone()
            total, top = sum(t.to(torch.float64) for t in everyone), torch.stack(everyone).amax(0)
            checks = []
            recv = torch.empty(world * count, dtype=dtype)
            coll.allreduce(send, recv, "sum")
            checks.append(("allreduce sum", recv, total.to(dtype)))
            inplace = send.clone()
            coll.allreduce(inplace, inplace, "max")
            checks.append(("allreduce max in place", inplace, top))
            recv = torch.empty(count, dtype=dtype)
            coll.reduce_scatter(send, recv, "sum")
            block = slice(rank * count, (rank + 1) * count)
            checks.append(("reduce_scatter sum", recv, total.to(dtype)[block]))
            recv = torch.empty(count, dtype=dtype)
            coll.reduce_scatter(send, recv, "max")
            checks.append(("reduce_scatter max", recv, top[block]))
            recv = torch.empty(world * count, dtype=dtype)
            coll.allgather(send[:count], recv)
            checks.append(("allgather", recv, torch.cat([t[:count] for t in everyone])))
            recv = torch.empty(world * count, dtype=dtype)
            coll.alltoall(send, recv)
            checks.append(("alltoall", recv, torch.cat([t[block] for t in everyone])))
            for what, got, want in checks:
                if not torch.equal(got, want.to(dtype)):
                    problems.append(f"{what} {dtype} forced={forced}: {got.tolist()} != "
                                    f"{want.tolist()}")
        if not forced:
            native_fallbacks = sorted(coll.fallbacks)
    return problems, native_fallbacks


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
