"""The ranks of test_torch_drop_in.py's multi-rank test (``mpirun -np 2``,
phase "zero_state"): dsopt.torch.AdamW under ZeRO stage 2 takes a
torch.optim.AdamW state dict into its shards (each rank writes its part of
every parameter, its ``optimizer.state`` views flat from ``"offset"``),
refuses what needs the whole state (torch_state_dict, add_param_group once
parameters have state, deepcopy), and trains on within fp32 rounding of
torch.optim.AdamW (every rank the same data). The phase returns how many
elements of the moments this rank holds; the test checks that the ranks'
parts cover every parameter once. Phase "whole_checkpoint":
``state_dict_all_ranks`` gathered through mpi4py resumes every rank's
shard bit for bit."""

import copy
import sys

import torch

import dsopt.torch


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def step(model, opt, k):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(k))
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def phase_zero_state(comm, rank, size):
    ref_model, model = make(), make()
    ref = torch.optim.AdamW([{"params": ref_model[0].parameters()},
                             {"params": ref_model[2].parameters(), "lr": 0.02}], lr=0.01)
    for k in range(3):
        step(ref_model, ref, k)
    model.load_state_dict(ref_model.state_dict())
    extra = torch.nn.Parameter(torch.zeros(5))
    opt = dsopt.torch.AdamW(model[0].parameters(), lr=0.01, zero_stage=2, comm=comm)
    opt.add_param_group({"params": model[2].parameters()})  # no state yet: rebuilt
    opt.load_state_dict(ref.state_dict())
    assert opt.dsopt.get_group_lr(1) == 0.02
    held = 0
    for p, q in zip(model.parameters(), ref_model.parameters()):
        entry = opt.state[p]
        offset, n = entry["offset"], entry["exp_avg"].numel()
        assert entry["exp_avg"].shape == (n,) and 0 <= offset and offset + n <= p.numel()
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(entry[key], ref.state[q][key].reshape(-1)[offset:offset + n])
        assert int(entry["step"]) == 3
        held += n
    for call, error, match in (
            (opt.torch_state_dict, ValueError, "ZeRO"),
            (lambda: opt.add_param_group({"params": [extra]}), RuntimeError, "ZeRO"),
            (lambda: copy.deepcopy(opt), RuntimeError, "collective")):
        try:
            call()
        except error as exc:
            assert match in str(exc), exc
        else:
            raise AssertionError(f"{call} did not raise")
    assert len(opt.param_groups) == 2
    for k in range(3, 6):
        step(model, opt, k)
        step(ref_model, ref, k)
    for p, q in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    opt.close()
    return held


def phase_whole_checkpoint(comm, rank, size):
    """``state_dict_all_ranks`` over an mpi4py communicator: rank 0 gets
    every rank's blob; that one dict, sent to every rank, resumes each
    rank's ZeRO-2 shard bit for bit."""
    model = make()
    opt = dsopt.torch.AdamW(model.parameters(), lr=0.01, zero_stage=2, comm=comm)
    for k in range(3):
        step(model, opt, k)
    whole = opt.state_dict_all_ranks(0)
    assert (whole is None) == (rank != 0), whole
    if rank == 0:
        assert len(whole["dsopt_rank_states"]) == size
    weights = copy.deepcopy(model.state_dict())
    whole = comm.mpi4py_comm.bcast(whole, root=0)
    for k in range(3, 6):
        step(model, opt, k)
    resumed = make()
    resumed.load_state_dict(weights)
    again = dsopt.torch.AdamW(resumed.parameters(), lr=0.01, zero_stage=2, comm=comm)
    again.load_state_dict(whole)
    for k in range(3, 6):
        step(resumed, again, k)
    for p, q in zip(model.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    opt.close()
    again.close()


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"zero_state": phase_zero_state, "whole_checkpoint": phase_whole_checkpoint}))
