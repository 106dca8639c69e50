"""One rank of test_torch_whole_checkpoint.py: trains a small classifier on
scikit-learn's digits with a dsopt.torch optimizer for SAVE_AT steps, saves
``state_dict_all_ranks()`` from rank 0 only (as frameworks do), trains on
(the uninterrupted run), then a fresh model and optimizer on every rank load
that one file and train the same steps again (the resumed run). With
SAVED_WORLD, it only resumes the file a run of SAVED_WORLD ranks saved,
each rank's batch the union of the batches the saved run's ranks it stands
for had (so the global batch stays the same).

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. \
        python whole_checkpoint_worker.py NAMES OUT_DIR [SAVED_WORLD]

NAMES: comma-separated keys of OPTIMIZERS."""

import json
import os
import sys
import warnings

import torch

import dsopt
import dsopt.torch
from torch_comm_worker import digits

SAVE_AT, AFTER, BATCH = 6, 4, 32

OPTIMIZERS = {
    "adamw": lambda p: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01),
    "adamw_zero2": lambda p: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01, zero_stage=2),
    "onebit_adam": lambda p: dsopt.torch.OneBitAdam(p, lr=3e-3, freeze_step=3),
    # AdamW over a model cast to bf16 right before the save (followed there)
    "adamw_cast": lambda p: dsopt.torch.AdamW(p, lr=3e-3, weight_decay=0.01),
}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.Tanh(), torch.nn.Linear(24, 10))


def batch(step, rank, world, saved_world):
    """This rank's batch: those of saved_world // world ranks of the saved run."""
    x, y = digits()
    per = saved_world // world
    starts = [(step * saved_world + r) * BATCH % (len(x) - BATCH)
              for r in range(rank * per, (rank + 1) * per)]
    return (torch.cat([x[s:s + BATCH] for s in starts]), torch.cat([y[s:s + BATCH] for s in starts]))


def train(net, opt, steps, rank, world, saved_world=None):
    losses = []
    for step in steps:
        xb, yb = batch(step, rank, world, saved_world or world)
        opt.zero_grad()
        dtype = next(net.parameters()).dtype
        loss = torch.nn.functional.cross_entropy(net(xb.to(dtype)).float(), yb)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def flat(net):
    return torch.cat([p.detach().reshape(-1).float() for p in net.parameters()]).tolist()


def main():
    names, out = sys.argv[1].split(","), sys.argv[2]
    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for name in names:
        if name == "foreign":
            foreign(rank, world, out)
        elif len(sys.argv) > 3:
            resume_elsewhere(rank, world, name, out, int(sys.argv[3]))
        else:
            save_and_resume(rank, world, name, out)
    torch.distributed.destroy_process_group()


def save_and_resume(rank, world, name, out):
    path = os.path.join(out, f"{name}-{world}.pt")
    net = model()
    opt = OPTIMIZERS[name](net.parameters())
    train(net, opt, range(SAVE_AT), rank, world)
    if name.endswith("_cast"):
        net.to(torch.bfloat16)
    whole = opt.state_dict_all_ranks()
    assert (whole is None) == (rank != 0)
    if rank == 0:
        torch.save({"model": net.state_dict(), "optimizer": whole}, path)
    torch.distributed.barrier()
    losses = train(net, opt, range(SAVE_AT, SAVE_AT + AFTER), rank, world)
    result = {"uninterrupted": {"losses": losses, "params": flat(net)}}
    opt.close()
    result["resumed"] = resume(path, rank, world, name, world)
    with open(os.path.join(out, f"{name}-{world}-rank{rank}.json"), "w") as f:
        json.dump(result, f)


def foreign(rank, world, out):
    """Rank 0's own state dict (1-bit Adam, compressing) on every rank."""
    net = model()
    opt = OPTIMIZERS["onebit_adam"](net.parameters())
    train(net, opt, range(SAVE_AT), rank, world)
    own = [opt.state_dict() if rank == 0 else None]
    torch.distributed.broadcast_object_list(own, src=0)
    before = flat(net)
    result = {}
    try:
        opt.load_state_dict(own[0])
        result["refused"] = None
    except dsopt.Mismatch as error:
        result["refused"] = str(error)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.load_state_dict(own[0], reset_rank_local=True)
    result["warnings"] = [str(w.message) for w in caught]
    result["unchanged_by_refusal"] = flat(net) == before
    result["losses"] = train(net, opt, range(SAVE_AT, SAVE_AT + AFTER), rank, world)
    result["params"] = flat(net)
    opt.close()
    with open(os.path.join(out, f"foreign-rank{rank}.json"), "w") as f:
        json.dump(result, f)


def resume(path, rank, world, name, saved_world):
    """A fresh model and optimizer load the whole checkpoint at ``path``
    and train AFTER steps."""
    net = model()
    if name.endswith("_cast"):
        net.to(torch.bfloat16)
    opt = OPTIMIZERS[name](net.parameters())
    saved = torch.load(path, weights_only=False) if "weights_only" in \
        torch.load.__code__.co_varnames else torch.load(path)
    net.load_state_dict(saved["model"])
    opt.load_state_dict(saved["optimizer"])
    losses = train(net, opt, range(SAVE_AT, SAVE_AT + AFTER), rank, world, saved_world)
    opt.close()
    return {"losses": losses, "params": flat(net)}


def resume_elsewhere(rank, world, name, out, saved_world):
    path = os.path.join(out, f"{name}-{saved_world}.pt")
    result = {"resumed": resume(path, rank, world, name, saved_world)}
    with open(os.path.join(out, f"{name}-{saved_world}-at-{world}-rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
