"""Parameters moved or cast after the dsopt.torch optimizer exists: the
model, optimizers, changes and runs of test_torch_param_moves.py, and its
2-rank run under ``mpirun -np 2`` (phase "moves"; every check is made on
the ranks, each rank with its own data).

The changes, made before the first step or mid-run:

* "cpu0": ``model.to(torch.device("cpu", 0))`` (torch copies every
  parameter: ``cpu`` and ``cpu:0`` differ), "f64_f32":
  ``model.to(torch.float64).to(torch.float32)``, "clone": ``p.data =
  p.data.clone()``: new storage of the same dtype and device. dsopt is
  pointed at it and the run goes on bit for bit as one whose storage
  never moved; the old storage (kept alive here) is never written.
* "bf16": ``model.to(torch.bfloat16)`` of an fp32 model, "fp32":
  ``model.to(torch.float32)`` of a bf16 model. AdamW and ZeRO-2 go on as
  a run that carried the same state over by torch.optim's means: its
  state as a torch.optim state dict (fp32 moments, step counts) loaded
  into a new optimizer over the cast model (fp32 masters from the cast
  values; ZeRO-2 agrees with stage-0 AdamW bit for bit at one and two
  ranks). 1-bit Adam past its first step refuses (RuntimeError, nothing
  written) and goes on once cast back; before its first step it starts
  over the cast model.
* "device": another device. Without CUDA here the optimizer is told that
  its parameters were on another device (``fake_device_move``), so that
  the rebuild with the whole state carried through a state blob runs on
  the CPU; it goes on bit for bit, 1-bit Adam in its compressed stage
  included."""

import sys

import torch

import dsopt.torch

STEPS = 6
MID_RUN = 3  # 1-bit Adam: freeze_step 3, so compressed from update 3 on
CHANGES = ("cpu0", "f64_f32", "clone", "bf16", "fp32", "device")
# The casts: (the model's dtype before, after).
CASTS = {"bf16": (torch.float32, torch.bfloat16), "fp32": (torch.bfloat16, torch.float32)}


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model.to(dtype)


def make_opt(kind, model, comm=None, **kwargs):
    params = model.parameters()
    if kind == "adamw":
        return dsopt.torch.AdamW(params, lr=0.01, weight_decay=0.01, comm=comm, **kwargs)
    if kind == "zero2":
        return dsopt.torch.AdamW(params, lr=0.01, weight_decay=0.01, zero_stage=2, comm=comm,
                                 **kwargs)
    if kind == "onebit":
        return dsopt.torch.OneBitAdam(params, lr=0.01, weight_decay=0.01, freeze_step=MID_RUN,
                                      comm=comm, **kwargs)
    raise ValueError(kind)


KINDS = ("adamw", "onebit", "zero2")


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 + 97 * rank + step)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def train(model, opt, steps, first=0, rank=0):
    for step in range(first, first + steps):
        x, y = batch(step, rank)
        dtype = next(model.parameters()).dtype
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
        opt.step()


def fake_device_move(model, opt):
    """A move to another device as the optimizer sees one (new storage, and
    dsopt's parameters on another device than they are now): the rebuild
    that carries the whole state over runs without a second device."""
    model.to(torch.device("cpu", 0))
    opt._storage.device = torch.device("meta")


def change(model, name, opt=None):
    """Makes change ``name`` (see the module doc) to ``model``'s parameters."""
    if name == "cpu0":
        before = [p.data_ptr() for p in model.parameters()]
        model.to(torch.device("cpu", 0))
        assert all(p.data_ptr() != b for p, b in zip(model.parameters(), before)), \
            "model.to(cpu:0) kept some storage: nothing to test"
    elif name == "f64_f32":
        model.to(torch.float64).to(torch.float32)
    elif name == "clone":
        for p in model.parameters():
            p.data = p.data.clone()
    elif name in CASTS:
        model.to(CASTS[name][1])
    elif name.startswith("through_"):  # the values a cast there and back leaves, in place
        through = CASTS[name[len("through_"):]][1]
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(through))
    elif name == "device":
        fake_device_move(model, opt)
    else:
        raise ValueError(name)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def run(kind, name=None, at=MID_RUN, comm=None, rank=0, dtype=torch.float32, keep_old=False,
        **kwargs):
    """The parameters after STEPS steps of ``kind`` over a ``dtype`` model
    with change ``name`` made after ``at`` steps (None: no change), and the
    optimizer's last ``StepInfo``. The storage the change leaves is freed
    (under ASan a write to it is reported), or with ``keep_old`` kept and
    checked to be unchanged by the steps after it."""
    model = make_model(dtype)
    opt = make_opt(kind, model, comm, **kwargs)
    train(model, opt, at, rank=rank)
    old = [p.data for p in model.parameters()] if keep_old else []
    old_values = [t.clone() for t in old]
    if name is not None:
        change(model, name, opt)
    train(model, opt, STEPS - at, first=at, rank=rank)
    for p, t, v in zip(model.parameters(), old, old_values):
        assert p.data_ptr() != t.data_ptr(), f"{kind} {name}: the storage did not move"
        assert torch.equal(t, v), f"{kind} {name}: the storage the model left was written"
    info = opt.last_step_info
    opt.close()
    return params_of(model), info


def fp32_torch_state(opt):
    """``opt.torch_state_dict()`` with dsopt's fp32 moments (it gives them
    in the parameters' dtype)."""
    state_dict = opt.torch_state_dict()
    params = [p for group in opt.param_groups for p in group["params"]]
    for i, entry in state_dict["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            entry[key] = opt.state[params[i]][key].clone()
    return state_dict


def cast_reference(kind, name, at, comm=None, rank=0):
    """The parameters of a run that makes cast ``name`` after ``at`` steps
    and carries its state over by torch.optim's means: stage-0 AdamW for
    ``at`` steps, its state as a torch.optim state dict loaded into a new
    ``kind`` optimizer over the cast model, then the other steps."""
    before, after = CASTS[name]
    model = make_model(before)
    state = None
    if at:
        opt = make_opt("adamw", model, comm)
        train(model, opt, at, rank=rank)
        state = fp32_torch_state(opt)
        opt.close()
    model.to(after)
    opt = make_opt(kind, model, comm)
    if state is not None:
        opt.load_state_dict(state)
    train(model, opt, STEPS - at, first=at, rank=rank)
    opt.close()
    return params_of(model)


def refused_cast_goes_on_once_cast_back(kind, name, comm=None, rank=0):
    """1-bit Adam cast mid-run: step() raises RuntimeError naming the
    parameter, the cast and what to do, writes nothing, and once the model
    is cast back the run goes on as one never cast (whose values went
    through the cast in place). Returns the parameters."""
    before, after = CASTS[name]
    model = make_model(before)
    opt = make_opt(kind, model, comm)
    train(model, opt, MID_RUN, rank=rank)
    model.to(after)
    cast = params_of(model)
    x, y = batch(MID_RUN, rank)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x.to(after)).float(), y).backward()
    try:
        opt.step()
    except RuntimeError as error:
        text = str(error)
        assert "parameter 0" in text and str(after) in text and \
            "before creating the optimizer" in text and "Nothing was updated" in text, text
    else:
        raise AssertionError("the cast was not refused")
    assert not differences(params_of(model), cast), "a refused step wrote the parameters"
    model.to(before)
    train(model, opt, STEPS - MID_RUN, first=MID_RUN, rank=rank)
    opt.close()
    return params_of(model)


def differences(a, b):
    """Indices of the parameters whose bits differ."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if x.dtype != y.dtype or not torch.equal(x, y)]


def check_change(kind, name, at, comm=None, rank=0):
    """Change ``name`` after ``at`` steps of ``kind`` continues as the
    module doc says (AssertionError naming what differs)."""
    if name in CASTS and kind == "onebit" and at:
        got = refused_cast_goes_on_once_cast_back(kind, name, comm, rank)
        want, _ = run(kind, "through_" + name, comm=comm, rank=rank, dtype=CASTS[name][0])
    else:
        dtype = CASTS[name][0] if name in CASTS else torch.float32
        got, info = run(kind, name, at, comm, rank, dtype=dtype)
        kept, _ = run(kind, name, at, comm, rank, dtype=dtype, keep_old=True)
        bad = differences(kept, got)
        assert not bad, f"{kind}, {name} after {at} steps, old storage kept: parameters {bad} " \
                        f"differ from the run that freed it"
        if name in CASTS:
            want = cast_reference(kind, name, at, comm, rank)
        else:
            want, want_info = run(kind, comm=comm, rank=rank)
            assert info.step == want_info.step == STEPS, (info, want_info)
    bad = differences(got, want)
    assert not bad, f"{kind}, {name} after {at} steps: parameters {bad} differ"


def phase_moves(comm, rank, size):
    _, info = run("onebit", comm=comm, rank=rank)
    assert info.compressed, f"1-bit Adam never reached its compressed stage: {info}"
    checked = 0
    for kind in KINDS:
        for name in CHANGES:
            for at in (0, MID_RUN):
                check_change(kind, name, at, comm, rank)
                checked += 1
    return checked


def phase_not_collective(comm, rank, size):
    """On several ranks, what other ranks need not call at the same time
    (state_dict) refuses a cast it would have to rebuild for, changing
    nothing; the next step (collective) follows the cast."""
    model = make_model()
    opt = make_opt("adamw", model, comm)
    train(model, opt, 2, rank=rank)
    model.to(torch.bfloat16)
    dsopt_before = opt.dsopt
    try:
        opt.state_dict()
    except RuntimeError as error:
        assert "next step()" in str(error), error
    else:
        raise AssertionError("state_dict() rebuilt on several ranks")
    assert opt.dsopt is dsopt_before
    train(model, opt, 1, first=2, rank=rank)
    assert opt.dsopt is not dsopt_before
    blob = opt.state_dict()["dsopt_state"]
    opt.close()
    return len(blob)


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"moves": phase_moves, "not_collective": phase_not_collective}))
