"""Data-parallel training with dsopt.torch over torch.distributed.

A small MLP learns scikit-learn's digits. Every process trains on its
share of each global batch; dsopt.torch.AdamW (or OneBitAdam), created
after init_process_group with no ``comm``, averages the gradients over the
default process group (dsopt.Communicator.from_torch) and updates the same
parameters on every rank -- no DistributedDataParallel wrapper is needed.

    torchrun --nproc_per_node 4 examples/python/torchrun_train.py
    python3 examples/python/torchrun_train.py --spawn 4 --optimizer onebit
    python3 examples/python/torchrun_train.py              # one process

or with the variables torchrun would set, one command per rank:

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python3 examples/python/torchrun_train.py &
    RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python3 examples/python/torchrun_train.py

The backend is NCCL (parameters on the GPU, ``"device": "cuda"``) when CUDA
is available, else gloo on the CPU; ``--backend`` chooses. Rank 0 prints the
mean training loss of every epoch and the test accuracy.
(Debian's torch 1.13 ships a torchrun that fails on Python 3.11: use
``--spawn N`` or the variables above there.)
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bindings" / "python"))
import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
import local_ranks  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=["adamw", "onebit"], default="adamw",
                        help="dsopt AdamW, or 1-bit Adam (compressed after --freeze-step steps)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--freeze-step", type=int, default=40,
                        help="1-bit Adam: steps of plain Adam before compression")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    parser.add_argument("--spawn", type=int, default=0, metavar="N",
                        help="start N processes here with torch.multiprocessing")
    return parser.parse_args(argv)


def digits(device):
    """(x_train, y_train, x_test, y_test): scikit-learn's digits, pixels in
    [0, 1], a fixed 80/20 split (the same on every rank)."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return x[train].to(device), y[train].to(device), x[test].to(device), y[test].to(device)


def make_optimizer(args, params):
    """torch.optim.AdamW's one-line replacement, or 1-bit Adam (the device,
    CPU or CUDA, is where the parameters are)."""
    if args.optimizer == "onebit":
        return dsopt.torch.OneBitAdam(params, lr=args.lr, freeze_step=args.freeze_step)
    return dsopt.torch.AdamW(params, lr=args.lr, weight_decay=0.01)


def train(args):
    """The training of one process; torch.distributed is initialised when
    RANK/WORLD_SIZE are set (torchrun, --spawn, or by hand)."""
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if distributed:
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
                                  % torch.cuda.device_count())
        dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))

    x_train, y_train, x_test, y_test = digits(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10)).to(device)
    if distributed:
        for p in model.parameters():  # every rank starts from rank 0's parameters
            dist.broadcast(p.data, src=0)
    # comm=None: the default process group when torch.distributed is initialised
    opt = make_optimizer(args, model.parameters())
    local_batch = max(1, args.batch_size // world)
    if rank == 0:
        kind = opt.dsopt.communicator.kind
        print(f"dsopt.torch {args.optimizer} on {world} process(es), "
              f"{backend if distributed else 'no torch.distributed'} ({device}), "
              f"dsopt communicator: {kind}, batch {local_batch} x {world}", flush=True)

    started = time.monotonic()
    for epoch in range(args.epochs):
        # Every rank draws the same permutation and takes its share of each
        # global batch (what DistributedSampler does, without padding).
        order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(epoch))
        steps = len(order) // (local_batch * world)
        total = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, samples
        one = torch.ones((), dtype=torch.float64, device=device)
        sent = 0
        for step in range(steps):
            first = (step * world + rank) * local_batch
            idx = order[first:first + local_batch].to(device)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach().double(), one]) * len(idx)
            sent += opt.last_step_info.bytes_sent
        if distributed:
            dist.all_reduce(total)
        with torch.no_grad():
            accuracy = (model(x_test).argmax(dim=1) == y_test).double().mean().item()
        if rank == 0:
            info = opt.last_step_info
            phase = "compressed" if info.compressed else "full"
            print(f"epoch {epoch + 1}: loss {(total[0] / total[1]).item():.4f}  test accuracy "
                  f"{accuracy:.3f}  steps {info.step} ({phase})  rank 0 sent {sent / 1e6:.2f} MB",
                  flush=True)
    if rank == 0:
        print(f"done in {time.monotonic() - started:.1f} s", flush=True)
    opt.close()
    if distributed:
        dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    if args.spawn:
        local_ranks.spawn(train, args.spawn, args)
    else:
        train(args)


if __name__ == "__main__":
    main()
