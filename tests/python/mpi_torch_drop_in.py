"""The ranks of test_torch_optim_port.py's multi-rank test (``mpirun -np 4``,
phase "drop_in"): dsopt.torch.AdamW(comm=mpi4py's COMM_WORLD) as a drop-in
torch optimizer under data parallelism, checked on every rank against
torch.optim.AdamW on this one process fed what dsopt promises to step with.

Every rank trains the digits MLP of torch_port_common.DigitsNet on its own
quarter of each global batch:

* ``embed`` (the first layer) is frozen (requires_grad False): .grad is None
  on every rank, so it must stay as it was, bit for bit;
* ``side`` is a branch only rank 0 uses, and rank 0 only on two steps out of
  three: on those steps the other ranks have .grad None and contribute zeros
  to the mean; on the third step no rank has a gradient, so ``side`` must
  not move (bit for bit) and its state must not change;
* ``unused`` is used by no rank: unchanged bit for bit throughout.

The oracle gets, for every parameter, the mean over the ranks of their
gradients (zeros for a rank whose .grad was None), or .grad None where every
rank had None, and steps torch.optim.AdamW with it. Feeding the oracle dsopt's
own gradients (not its own forward pass) keeps the two from drifting apart,
so the parameters agree within fp32 rounding (torch_port_common's
tolerances) at every step; the ranks' parameters are identical bit for bit.
"""

import copy
import sys

import numpy as np
import torch

import dsopt.torch
import torch_port_common as common

STEPS = 16
BATCH = 64  # global; each rank gets BATCH // size of it
KWARGS = {"lr": 0.01, "betas": (0.9, 0.99), "eps": 1e-8, "weight_decay": 0.05}


def side_user(step, rank):
    return rank == 0 and step % 3 != 2


def mean_or_none(grads, like):
    """The mean over ranks (None counted as zeros), or None when every rank
    had None."""
    if all(g is None for g in grads):
        return None
    total = np.zeros(like.shape, dtype=np.float32)
    for g in grads:
        if g is not None:
            total += g
    return torch.from_numpy(total / np.float32(len(grads)))


def phase_drop_in(_comm, rank, size):
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    torch.set_num_threads(1)
    x, y = common.digits_tensors()
    ours_model = common.DigitsNet()
    ref_model = copy.deepcopy(ours_model)
    for model in (ours_model, ref_model):
        model.embed.requires_grad_(False)
    opt = dsopt.torch.AdamW(ours_model.parameters(), comm=world, **KWARGS)
    ref = torch.optim.AdamW(ref_model.parameters(), **KWARGS)
    names = [name for name, _ in ours_model.named_parameters()]
    ours = dict(ours_model.named_parameters())
    theirs = dict(ref_model.named_parameters())
    initial = {name: p.detach().clone() for name, p in ours.items()}
    local = BATCH // size
    losses = []
    side_steps = 0
    for step, batch in enumerate(common.batches(len(y), BATCH, STEPS)):
        idx = torch.from_numpy(batch[rank * local:(rank + 1) * local])
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ours_model(x[idx], side_user(step, rank)), y[idx])
        loss.backward()
        losses.append(loss.item())
        mine = [None if ours[n].grad is None else ours[n].grad.detach().numpy().copy()
                for n in names]
        everyone = world.allgather(mine)
        for i, n in enumerate(names):
            theirs[n].grad = mean_or_none([g[i] for g in everyone], ours[n])
        nobody = [n for n in names if theirs[n].grad is None]
        before = {n: (ours[n].detach().clone(), common.snapshot_state(opt, ours[n]))
                  for n in nobody}
        opt.step()
        ref.step()
        what = f"rank {rank}/{size}, step {step + 1}"
        for n in names:
            if n in before:
                value, state = before[n]
                assert torch.equal(ours[n].detach(), value), \
                    f"{what}: {n} had no gradient on any rank but changed"
                common.assert_state_unchanged(opt, ours[n], state, f"{what}: {n}")
            common.assert_param_close(ours[n], theirs[n], f"{what}: {n}")
            common.assert_state_close(opt, ref, ours[n], theirs[n], f"{what}: {n}")
        side_steps += any(side_user(step, r) for r in range(size))
        # The ranks hold the same parameters, bit for bit.
        flat = torch.cat([p.detach().reshape(-1) for p in ours_model.parameters()]).numpy()
        root = world.bcast(flat if rank == 0 else None, root=0)
        assert np.array_equal(flat.view(np.uint32), root.view(np.uint32)), \
            f"{what}: parameters differ from rank 0's"
    for n in ("embed.weight", "embed.bias", "unused.weight", "unused.bias"):
        assert torch.equal(ours[n].detach(), initial[n]), f"rank {rank}: {n} moved"
        assert common.step_count(common.state_of(opt, ours[n])) == 0, \
            f"rank {rank}: {n} has a step count"
    for n in ("side.weight", "side.bias", "head.weight", "body.weight"):
        assert not torch.equal(ours[n].detach(), initial[n]), f"rank {rank}: {n} never moved"
    side_state = common.state_of(opt, ours["side.weight"])
    assert common.step_count(side_state) == side_steps, (common.step_count(side_state), side_steps)
    mean_losses = world.allreduce(np.array(losses)) / size
    assert mean_losses[-4:].mean() < mean_losses[:4].mean(), mean_losses
    opt.close()
    return STEPS


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"drop_in": phase_drop_in}))
