"""One rank of test_fsdp2.py: dsopt.torch optimizers on FSDP2 models
(torch.distributed.fsdp.fully_shard over gloo, or NCCL with
DSOPT_FSDP2_DEVICE=cuda), launched as torchrun launches (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT):

    python fsdp2_worker.py PHASE OUT_DIR CKPT_DIR

writes OUT_DIR/<PHASE>-rank<r>.json, what each check found; the test says
what must hold. The model is a small MLP whose layers shard unevenly (7
rows, 3 rows, 1 row: at 2 and 4 ranks some rank holds none of a tensor);
every step is one global batch of 8 rows, each rank its slice, so that a
run continues alike at any world size. Phases:

* ``two`` (2 ranks): each algorithm against torch.optim on the same FSDP2
  model and, bit for bit, against dsopt on the whole model fed FSDP2's own
  gradients (``whole``); LAMB and clipping against the whole model;
  CPUOffloadPolicy; what is refused; DCP resume at the same world size;
  checkpoints for ``four``.
* ``four`` (4 ranks): the checkpoints of ``two`` loaded (2 -> 4) and
  continued next to the 2-rank continuation and torch's own resharded
  resume; dsopt and torch loading each other's checkpoints; FSDP2's own
  HSDP (AdamW against torch's, the 1-bit optimizers refused); HSDP 2 x 2
  with the 1-bit optimizers across the replicas, against
  the same optimizer on the shards with the same gradients, DCP resume of
  it; checkpoints for ``back``.
* ``back`` (2 ranks): 4 -> 2, and the 1-bit checkpoint at another topology.
* ``cuda`` (DSOPT_FSDP2_DEVICE=cuda, one rank per GPU): ``two``'s checks
  that hold at any world size, on CUDA tensors over NCCL.
"""

import json
import os
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "bindings" / "python"))

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.state_dict import (  # noqa: E402
    get_model_state_dict, get_optimizer_state_dict, set_model_state_dict,
    set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard  # noqa: E402

DEVICE = os.environ.get("DSOPT_FSDP2_DEVICE", "cpu")
BATCH = 8
TORCH = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}
KWARGS = {"AdamW": dict(lr=1e-2, weight_decay=0.1), "Adam": dict(lr=1e-2, weight_decay=0.01),
          "SGD": dict(lr=5e-2, momentum=0.9, weight_decay=0.01), "Lion": dict(lr=1e-3, weight_decay=0.1),
          "Lamb": dict(lr=2e-2, weight_decay=0.01)}


def device():
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")


def plain_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3),
                               torch.nn.Tanh(), torch.nn.Linear(3, 1)).to(device())


def sharded(mesh=None, **kw):
    model = plain_model()
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def batch(step, part, parts):
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 1, generator=g)
    n = BATCH // parts
    return x[part * n:(part + 1) * n].to(device()), y[part * n:(part + 1) * n].to(device())


def train(model, opt, steps, part=None, parts=None, clip=None):
    """Losses of ``steps`` steps; the batch slice of this rank (or ``part``
    of ``parts``)."""
    part = dist.get_rank() if part is None else part
    parts = dist.get_world_size() if parts is None else parts
    losses = []
    for k in steps:
        x, y = batch(k, part, parts)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(float(loss))
    return losses


def full(model):
    return [p.full_tensor().detach().cpu() for p in model.parameters()]


def max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


# every dsopt optimizer made here, closed (collectively, in the same order on
# every rank) before the process group goes: a torch group kept alive to the
# interpreter's exit can abort the process as gloo is torn down
MADE = []


def make(name, params, **kw):
    opt = getattr(dsopt.torch, name)(params, **dict(KWARGS.get(name, {}), **kw))
    MADE.append(opt)
    return opt


def against_whole(name, steps=5, **kw):
    """dsopt ``name`` on the FSDP2 model, and dsopt ``name`` on a whole copy
    (a local communicator) stepped with the FSDP2 model's own gradients:
    (max |difference|, whether equal bit for bit, losses)."""
    model = sharded()
    opt = make(name, model.parameters(), **kw)
    whole = plain_model()
    ref = make(name, whole.parameters(), comm=dsopt.Communicator.local(), **kw)
    losses = []
    for k in range(steps):
        x, y = batch(k, dist.get_rank(), dist.get_world_size())
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p, q in zip(model.parameters(), whole.parameters()):
            q.grad = p.grad.full_tensor().detach().clone()
        opt.step()
        ref.step()
        losses.append(float(loss))
    mine, theirs = full(model), [p.detach().cpu() for p in whole.parameters()]
    return {"diff": max_diff(mine, theirs), "equal": all(map(torch.equal, mine, theirs)),
            "losses": losses, "info": repr(opt.last_step_info), "moved": max_diff(mine, full(sharded()))}


def against_torch(name, steps=8, clip=None):
    """dsopt ``name`` against torch.optim's on the same FSDP2 model; with
    ``clip``, dsopt's gradient_clipping against torch's clip_grad_norm_."""
    a, b = sharded(), sharded()
    oa = make(name, a.parameters(), **({} if clip is None else {"gradient_clipping": clip}))
    ob = TORCH[name](b.parameters(), **KWARGS[name])
    la = train(a, oa, range(steps))
    lb = train(b, ob, range(steps), clip=clip)
    return {"diff": max_diff(full(a), full(b)), "loss_diff": max(abs(u - v) for u, v in zip(la, lb))}


def refused(fn):
    try:
        fn()
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def refusals():
    model = sharded()
    params = list(model.parameters())
    out = {
        "onebit": refused(lambda: dsopt.torch.OneBitAdam(params, lr=1e-3)),
        "onebit_lamb": refused(lambda: dsopt.torch.OneBitLamb(params, lr=1e-3)),
        "zero_one_adam": refused(lambda: dsopt.torch.ZeroOneAdam(params, lr=1e-3)),
        "zero": refused(lambda: dsopt.torch.AdamW(params, zero_stage=1)),
        "overlap": refused(lambda: dsopt.torch.AdamW(params, overlap=True)),
        "mixed": refused(lambda: dsopt.torch.AdamW(params + [torch.nn.Parameter(torch.ones(2))])),
    }
    from torch.distributed.tensor import Shard
    other = torch.nn.Linear(4, 6).to(device())
    fully_shard(other, shard_placement_fn=lambda p: Shard(1) if p.ndim == 2 else None)
    out["placement"] = refused(lambda: dsopt.torch.AdamW(other.parameters()))
    other_mesh = sharded(mesh=init_device_mesh(DEVICE, (1, dist.get_world_size()),
                                                mesh_dim_names=("replicate", "shard")))
    out["meshes"] = refused(lambda: dsopt.torch.AdamW(params + list(other_mesh.parameters())))
    opt = make("AdamW", params)
    out["add_param_group"] = refused(lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}))
    return out


def offload():
    """CPUOffloadPolicy (pinned memory only with CUDA): dsopt AdamW against
    torch's on the offloaded model."""
    policy = CPUOffloadPolicy(pin_memory=DEVICE == "cuda")
    a, b = sharded(offload_policy=policy), sharded(offload_policy=policy)
    oa, ob = make("AdamW", a.parameters()), torch.optim.AdamW(b.parameters(), **KWARGS["AdamW"])
    train(a, oa, range(5))
    train(b, ob, range(5))
    local = next(a.parameters())._local_tensor
    return {"diff": max_diff(full(a), full(b)), "param_device": str(local.device)}


def save(model, opt, path):
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
             checkpoint_id=str(path))


def load(model, opt, path, **kw):
    sd = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}
    dcp.load(sd, checkpoint_id=str(path), **kw)
    set_model_state_dict(model, sd["model"])
    set_optimizer_state_dict(model, opt, sd["optim"])


def resume(name, path, first=3, then=4, **kw):
    """Saved after ``first`` steps and resumed by a new model and optimizer:
    whether the ``then`` steps after it are the uninterrupted run's, bit
    for bit (and a fresh optimizer's are not)."""
    a = sharded()
    oa = make(name, a.parameters(), **kw)
    train(a, oa, range(first))
    save(a, oa, path)
    train(a, oa, range(first, first + then))
    b = sharded()
    ob = make(name, b.parameters(), **kw)
    load(b, ob, path)
    train(b, ob, range(first, first + then))
    # the control: the model alone resumed, with a fresh optimizer
    c = sharded()
    oc = make(name, c.parameters(), **kw)
    sd = {"model": get_model_state_dict(c)}
    dcp.load(sd, checkpoint_id=str(path))
    set_model_state_dict(c, sd["model"])
    train(c, oc, range(first, first + then))
    return {"equal": all(map(torch.equal, full(a), full(b))), "step": oa.last_step_info.step,
            "resumed_step": ob.last_step_info.step, "fresh_differs": max_diff(full(a), full(c))}


def phase_two(out, ckpt):
    out["whole"] = {name: against_whole(name) for name in ("AdamW", "Adam", "Lion", "SGD")}
    out["whole_clipped"] = against_whole("AdamW", gradient_clipping=0.05)
    out["lamb"] = against_whole("Lamb", gradient_clipping=0.5)
    out["torch"] = {name: against_torch(name) for name in TORCH}
    out["torch_clipped"] = against_torch("AdamW", clip=0.05)
    out["offload"] = offload()
    out["refused"] = refusals()
    out["resume"] = {name: resume(name, ckpt / f"resume_{name}") for name in ("AdamW", "Lamb")}
    # the checkpoints the 4-rank phase loads, and this run's continuation
    for kind in ("dsopt", "torch"):
        model = sharded()
        opt = make("AdamW", model.parameters()) if kind == "dsopt" else \
            torch.optim.AdamW(model.parameters(), **KWARGS["AdamW"])
        train(model, opt, range(4))
        save(model, opt, ckpt / f"adamw_{kind}_2")
        out[f"continued_{kind}"] = {"losses": train(model, opt, range(4, 8)),
                                    "params": [p.tolist() for p in full(model)]}


def hsdp_run(name, steps, kw):
    """1-bit ``name`` on HSDP 2 x 2 (dsopt across the replicas), and the
    same optimizer over the replica group on copies of the local shards
    fed the FSDP2 model's own local gradients: whether they agree bit for
    bit, whether the replicas of each shard agree, whether it compressed."""
    mesh = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("replicate", "shard"))
    model = sharded(mesh=mesh["shard"])
    opt = make(name, model.parameters(), **kw)
    held = [p for p in model.parameters() if p._local_tensor.numel()]  # a plain optimizer takes no empty tensor
    shadow = [torch.nn.Parameter(p._local_tensor.detach().clone()) for p in held]
    ref = make(name, shadow, comm=dsopt.Communicator.from_torch(mesh.get_group("replicate")), **kw)
    for k in range(steps):
        x, y = batch(k, dist.get_rank(), 4)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p, q in zip(held, shadow):
            q.grad = p.grad._local_tensor.detach().clone()
        opt.step()
        ref.step()
    mine = [p._local_tensor.detach().cpu() for p in held]
    same = all(torch.equal(a, b.detach().cpu()) for a, b in zip(mine, shadow))
    gathered = []
    for t in mine:
        bufs = [torch.empty_like(t) for _ in range(2)]
        dist.all_gather(bufs, t.contiguous(), group=mesh.get_group("replicate"))
        gathered.append(torch.equal(bufs[0], bufs[1]))
    ref.close()
    return {"equal_to_shards": same, "replicas_equal": all(gathered),
                              "compressed": bool(opt.last_step_info.compressed),
                              "finite": all(bool(torch.isfinite(t).all()) for t in mine),
                              "moved": max_diff(full(model), full(sharded(mesh=mesh["shard"])))}


def hsdp_grads_differ():
    """Under HSDP by dsopt FSDP2 reduce-scatters within the shard group
    only: the replicas' local gradients differ (no all-reduce across them)."""
    mesh = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("replicate", "shard"))
    model = sharded(mesh=mesh["shard"])
    x, y = batch(0, dist.get_rank(), 4)
    torch.nn.functional.mse_loss(model(x), y).backward()
    g = next(model.parameters()).grad._local_tensor.detach().contiguous()
    bufs = [torch.empty_like(g) for _ in range(2)]
    dist.all_gather(bufs, g, group=mesh.get_group("replicate"))
    return not torch.equal(bufs[0], bufs[1])


def phase_four(out, ckpt):
    # 2 -> 4: dsopt's and torch's checkpoints of the 2-rank run, continued
    for kind in ("dsopt", "torch"):
        model = sharded()
        opt = make("AdamW", model.parameters()) if kind == "dsopt" else \
            torch.optim.AdamW(model.parameters(), **KWARGS["AdamW"])
        load(model, opt, ckpt / f"adamw_{kind}_2")
        out[f"resharded_{kind}"] = {"losses": train(model, opt, range(4, 8)),
                                    "params": [p.tolist() for p in full(model)]}
    # each loads the other's checkpoint (torch.optim's layout both ways)
    for kind, other in (("dsopt", "torch"), ("torch", "dsopt")):
        model = sharded()
        opt = make("AdamW", model.parameters()) if kind == "dsopt" else \
            torch.optim.AdamW(model.parameters(), **KWARGS["AdamW"])
        # dsopt's state dict has entries torch's checkpoint lacks
        partial = {"planner": DefaultLoadPlanner(allow_partial_load=True)} if kind == "dsopt" else {}
        load(model, opt, ckpt / f"adamw_{other}_2", **partial)
        train(model, opt, range(4, 8))
        out[f"{kind}_from_{other}"] = {"params": [p.tolist() for p in full(model)]}
    model = sharded()
    opt = make("AdamW", model.parameters())
    train(model, opt, range(4))
    save(model, opt, ckpt / "adamw_dsopt_4")
    train(model, opt, range(4, 8))
    out["continued_4"] = {"params": [p.tolist() for p in full(model)]}
    out["hsdp_grads_differ"] = hsdp_grads_differ()
    # FSDP2's own HSDP (a 2-D mesh): FSDP2 averages across the replicas,
    # dsopt steps on the shards; the 1-bit optimizers and a comm refused
    mesh = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("replicate", "shard"))
    a, b = sharded(mesh=mesh), sharded(mesh=mesh)
    oa, ob = make("AdamW", a.parameters()), torch.optim.AdamW(b.parameters(), **KWARGS["AdamW"])
    train(a, oa, range(6))
    train(b, ob, range(6))
    out["native_hsdp"] = {
        "diff": max_diff(full(a), full(b)),
        "onebit": refused(lambda: dsopt.torch.OneBitAdam(a.parameters(), lr=1e-3)),
        "comm": refused(lambda: dsopt.torch.AdamW(a.parameters(), comm=mesh.get_group("replicate")))}
    runs = {"OneBitAdam": dict(lr=1e-2, freeze_step=3), "OneBitLamb": dict(lr=1e-2, freeze_step=3),
            "ZeroOneAdam": dict(lr=1e-2, var_freeze_step=3)}
    out["hsdp"] = {}
    for name, kw in runs.items():
        out["hsdp"][name] = hsdp_run(name, 7, kw)
    # DCP resume of 1-bit Adam under HSDP at the same topology, compressing
    kw = runs["OneBitAdam"]
    mesh = init_device_mesh(DEVICE, (2, 2), mesh_dim_names=("replicate", "shard"))
    a = sharded(mesh=mesh["shard"])
    oa = make("OneBitAdam", a.parameters(), **kw)
    train(a, oa, range(5), dist.get_rank(), 4)
    save(a, oa, ckpt / "onebit_2x2")
    train(a, oa, range(5, 9), dist.get_rank(), 4)
    b = sharded(mesh=mesh["shard"])
    ob = make("OneBitAdam", b.parameters(), **kw)
    load(b, ob, ckpt / "onebit_2x2")
    train(b, ob, range(5, 9), dist.get_rank(), 4)
    out["hsdp_resume"] = {"equal": all(map(torch.equal, full(a), full(b))),
                          "compressed": bool(ob.last_step_info.compressed)}


def phase_back(out, ckpt):
    model = sharded()
    opt = make("AdamW", model.parameters())
    load(model, opt, ckpt / "adamw_dsopt_4")
    train(model, opt, range(4, 8))
    out["back"] = {"params": [p.tolist() for p in full(model)]}
    # the 1-bit checkpoint of 2 x 2 at 2 x 1: its compression errors belong
    # to 2 x 2 (not in the target state dict: allow_partial_load)
    mesh = init_device_mesh(DEVICE, (2, 1), mesh_dim_names=("replicate", "shard"))
    model = sharded(mesh=mesh["shard"])
    opt = make("OneBitAdam", model.parameters(), lr=1e-2, freeze_step=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load(model, opt, ckpt / "onebit_2x2", planner=DefaultLoadPlanner(allow_partial_load=True))
    losses = train(model, opt, range(5, 9), dist.get_rank(), 2)
    out["onebit_other_topology"] = {
        "warnings": [str(w.message) for w in caught if "starts over" in str(w.message)],
        "compressed": bool(opt.last_step_info.compressed), "step": opt.last_step_info.step,
        "finite": all(map(lambda v: v == v, losses))}


def phase_cuda(out, ckpt):
    """DSOPT_FSDP2_DEVICE=cuda (NCCL, one rank per GPU, any count): the
    checks of ``two`` that need no other world size."""
    out["whole"] = {name: against_whole(name) for name in ("AdamW", "Lion")}
    out["lamb"] = against_whole("Lamb", gradient_clipping=0.5)
    out["torch"] = {"AdamW": against_torch("AdamW")}
    out["offload"] = offload()
    out["resume"] = {"AdamW": resume("AdamW", ckpt / "resume_cuda")}
    model = sharded()
    opt = make("AdamW", model.parameters())
    train(model, opt, range(2))
    out["state_device"] = str(opt.state[next(model.parameters())]["exp_avg"]._local_tensor.device)


PHASES = {"two": phase_two, "four": phase_four, "back": phase_back, "cuda": phase_cuda}


def main():
    phase, out_dir, ckpt = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    torch.set_num_threads(1)
    out = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's own notes about DTensor/DCP
            PHASES[phase](out, ckpt)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    for opt in MADE:
        opt.close()
    (out_dir / f"{phase}-rank{dist.get_rank()}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
