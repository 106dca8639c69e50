"""One rank of test_ddp_hook.py: a small classifier on scikit-learn's
digits trained with a dsopt.torch optimizer three ways (dsopt alone; inside
DistributedDataParallel with dsopt.torch.ddp_comm_hook; inside DDP with
its own allreduce), recording the losses, the final parameters, dsopt's
bytes per step, the bytes this process wrote to its sockets during
training (/proc/self/io's wchar) and the warnings. bench/ddp_bytes.py
runs it for longer ($DSOPT_DDP_STEPS steps, default 8).

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python ddp_hook_worker.py OUT_DIR

(torchrun's variables) writes OUT_DIR/rank<RANK>.json. DSOPT_DDP_DEVICE=cuda
puts the model and the batches on the current GPU (every rank on it; gloo
as the process group's backend)."""

import json
import os
import sys
import warnings

import torch

import dsopt
import dsopt.torch
from torch_comm_worker import digits

STEPS = int(os.environ.get("DSOPT_DDP_STEPS", "8"))
DEVICE = torch.device(os.environ.get("DSOPT_DDP_DEVICE", "cpu"))
BATCH = 32

OPTIMIZERS = {
    "adamw": lambda p: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01),
    "adamw_zero2": lambda p: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01, zero_stage=2),
    "onebit_adam": lambda p: dsopt.torch.OneBitAdam(p, lr=3e-3, freeze_step=3),
    "onebit_lamb": lambda p: dsopt.torch.OneBitLamb(p, lr=3e-3, freeze_step=3),
    "zero_one_adam": lambda p: dsopt.torch.ZeroOneAdam(p, lr=3e-3, var_freeze_step=3),
}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.Tanh(), torch.nn.Linear(48, 10))


def written_bytes():
    """Bytes this process handed to write-type system calls so far (its
    sockets' traffic, gloo's included)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def train(rank, world, name, mode):
    x, y = (t.to(DEVICE) for t in digits())
    net = model().to(DEVICE)
    opt = OPTIMIZERS[name](net.parameters())
    runner = net
    if mode != "alone":
        runner = torch.nn.parallel.DistributedDataParallel(net)
        if mode == "hook":
            runner.register_comm_hook(None, dsopt.torch.ddp_comm_hook)
    losses, sent = [], []
    torch.distributed.barrier()
    before = written_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dsopt.DoubleReductionWarning)
        for step in range(STEPS):
            start = (step * world + rank) * BATCH % (len(x) - BATCH)
            xb, yb = x[start:start + BATCH], y[start:start + BATCH]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(runner(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            sent.append(opt.last_step_info.bytes_sent)
    wrote = written_bytes() - before
    torch.distributed.barrier()
    opt.close()
    double = [str(w.message) for w in caught if issubclass(w.category, dsopt.DoubleReductionWarning)]
    params = [p.detach().cpu().flatten().tolist() for p in net.parameters()]
    return {"device": str(next(net.parameters()).device), "losses": losses, "bytes_sent": sent, "wrote": wrote, "double_warnings": double,
            "params": params, "numel": sum(p.numel() for p in net.parameters())}


def main():
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results = {name: {mode: train(rank, world, name, mode) for mode in ("alone", "hook", "ddp")}
               for name in OPTIMIZERS}
    torch.distributed.destroy_process_group()
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
