"""One rank of test_fsdp_codes.py: dsopt.torch.fsdp (dsopt's codes as
FSDP2's collectives) over gloo on the CPU, checks named on the command line:

* ``collectives``: the reduce-scatter of each gradient codec (two calls, so
  the residual carries; an average and a sum) and the all-gather of each
  parameter codec called directly on random data; what each rank put in
  and got out, for the numpy reference of the test; the fallbacks (a bf16
  gradient, a MAX reduction); the unsharded weights a compressed model's
  forward sees against its exact shards.
* ``refusals``: what ``compress`` refuses, each error's text.
* ``resume``: a compressed model trained, checkpointed with
  torch.distributed.checkpoint (model, AdamW, the compression's
  residuals), trained on; then rebuilt, loaded and trained again.
* ``train``: the small GPT of examples/python/gpt.py uncompressed (FSDP2's
  collectives, counted) and compressed, same weights and batches.
* ``hsdp``: the GPT on a 2 x 2 mesh (replicated x sharded), compressed.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python fsdp_codes_worker.py OUT_DIR CHECKS

writes OUT_DIR/rank<RANK>.json (and .npz for the arrays). DSOPT_FSDP_STEPS
sets the training steps (default 30); DSOPT_FSDP_DEVICE=cuda runs the
collectives on GPU LOCAL_RANK over NCCL."""

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import dsopt
import dsopt.torch.fsdp as fsdp_codes
from dsopt.torch.fsdp._all_gather import CompressedAllGather
from dsopt.torch.fsdp._reduce_scatter import CompressedReduceScatter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import gpt  # noqa: E402
from fsdp2_compressed_train import sharded_gpt, train_steps  # noqa: E402

STEPS = int(os.environ.get("DSOPT_FSDP_STEPS", "30"))
HSDP_STEPS = 12
DEVICE = torch.device(os.environ.get("DSOPT_FSDP_DEVICE", "cpu"))
BATCH, CONFIG = 16, "tiny"
GRAD_BLOCK, PARAM_BLOCK = 16, 32  # small blocks: several per piece of the test's sizes


def random_values(seed, n):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * torch.exp(torch.empty(n).uniform_(-3, 3, generator=gen))
    return x.float().to(DEVICE)


def host(t):
    return t.cpu().numpy()


# ---- collectives -----------------------------------------------------------------------

def collectives(rank, world, arrays):
    out = {}
    m = 3 * GRAD_BLOCK + 5  # a short last block
    group = dist.group.WORLD
    for name in fsdp_codes.GRADIENT_CODECS:
        codec = dsopt.Codec(name, block=GRAD_BLOCK, threads=1, device=DEVICE.type)
        residual = torch.zeros(world * codec.residual_size(m), dtype=torch.uint8, device=DEVICE)
        rs = CompressedReduceScatter("m", codec, m, residual)
        for call, op in enumerate((dist.ReduceOp.AVG, dist.ReduceOp.SUM)):
            x = random_values(1000 * rank + 10 * call + len(name), world * m)
            y = torch.empty(m, device=DEVICE)
            rs(y, x, group, op)
            arrays[f"rs_{name}_{call}_in"] = host(x)
            arrays[f"rs_{name}_{call}_out"] = host(y)
            arrays[f"rs_{name}_{call}_residual"] = host(residual).copy()
        out[f"rs_{name}_bytes"] = rs.bytes_sent
    n = 2 * PARAM_BLOCK + 3
    for name in fsdp_codes.PARAMETER_CODECS:
        codec = dsopt.Codec(name, block=PARAM_BLOCK if name == "int8" else 0, device=DEVICE.type)
        ag = CompressedAllGather("m", codec)
        output = torch.empty(world * n, device=DEVICE)
        x = random_values(77 + rank, n)
        output[rank * n:(rank + 1) * n] = x
        ag(output, output[rank * n:(rank + 1) * n], group)
        arrays[f"ag_{name}_in"], arrays[f"ag_{name}_out"] = host(x), host(output)
        out[f"ag_{name}_bytes"] = ag.bytes_sent
    out["fallbacks"] = fallbacks(rank, world, m)
    out["unsharded"] = unsharded_weights(rank, world, arrays)
    return out


def fallbacks(rank, world, m):
    """bf16 gradients and a MAX reduction run FSDP2's own reduce-scatter
    (exact), warned once each, the residual untouched."""
    codec = dsopt.Codec("int4", block=GRAD_BLOCK, device=DEVICE.type)
    residual = torch.zeros(world * codec.residual_size(m), dtype=torch.uint8, device=DEVICE)
    rs = CompressedReduceScatter("blocks.0", codec, m, residual)
    report = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for case, dtype, op in (("bf16", torch.bfloat16, dist.ReduceOp.AVG),
                                ("max", torch.float32, dist.ReduceOp.MAX)):
            for _ in range(2):
                x = random_values(5 + rank, world * m).to(dtype)
                y = torch.empty(m, dtype=dtype, device=DEVICE)
                rs(y, x, dist.group.WORLD, op)
                expected = torch.empty(m, dtype=dtype, device=DEVICE)
                dist.reduce_scatter_tensor(expected, x, op=op)
                report[f"{case}_exact"] = bool(torch.equal(y, expected))
    report["warnings"] = [str(w.message) for w in caught if issubclass(w.category, fsdp_codes.UncompressedWarning)]
    report["uncompressed_calls"] = rs.uncompressed_calls
    report["residual_zero"] = bool((residual == 0).all())
    report["bytes"] = rs.bytes_sent
    return report


def unsharded_weights(rank, world, arrays):
    """A one-module model compressed with int8 parameters: after
    unshard() the weight is every rank's shard decoded, the shards stay
    exact."""
    torch.manual_seed(3)
    model = torch.nn.Linear(24, 8 * world, bias=False).to(DEVICE)
    full = model.weight.detach().clone()
    fully_shard(model)
    fsdp_codes.compress(model, gradients=None, parameters="int8", parameter_block_size=PARAM_BLOCK)
    model.unshard()
    seen = model.weight.detach().clone()
    model.reshard()
    arrays["unsharded_full"], arrays["unsharded_seen"] = host(full), host(seen)
    return {"shard_exact": bool(torch.equal(model.weight.full_tensor(), full))}


# ---- refusals ---------------------------------------------------------------------------

def error_of(call):
    try:
        call()
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def mlp(world, **shard_args):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8 * world), torch.nn.Tanh(), torch.nn.Linear(8 * world, 4))
    for layer in (model[0], model[2]):
        fully_shard(layer, **shard_args)
    fully_shard(model, **shard_args)
    return model


def two_param_groups(world):
    """A module whose parameters FSDP2 shards on two process groups (a
    per-parameter mesh from shard_placement_fn): two parameter groups."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult
    from torch.distributed.tensor import Shard
    other = DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu")
    info = FSDPMeshInfo(other, shard_mesh_dim=0)
    model = torch.nn.Linear(8, 4 * world)
    fully_shard(model, shard_placement_fn=lambda p: ShardPlacementResult(Shard(0), info) if p.ndim == 1 else None)
    return model


def refusals(rank, world, arrays):
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    out = {
        "not_sharded": error_of(lambda: fsdp_codes.compress(torch.nn.Linear(4, 4))),
        "bad_name": error_of(lambda: fsdp_codes.compress(mlp(world), gradients="int2")),
        "bad_block": error_of(lambda: fsdp_codes.compress(mlp(world), gradient_block_size=12)),
        "param_dtype": error_of(lambda: fsdp_codes.compress(mlp(world, mp_policy=bf16))),
        "reduce_dtype": error_of(lambda: fsdp_codes.compress(
            mlp(world, mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)), parameters=None)),
        "bf16_params": error_of(lambda: fsdp_codes.compress(bf16_model(world))),
    }
    model = mlp(world)
    model[0].set_gradient_divide_factor(2.0)
    out["divide_factor"] = error_of(lambda: fsdp_codes.compress(model))
    # refused: nothing installed on any module
    out["nothing_installed"] = all(type(m._get_fsdp_state()._fsdp_param_groups[0]._reduce_scatter_comm).__name__
                                   == "DefaultReduceScatter" for m in (model[0], model[2]))
    model = mlp(world)
    codes = fsdp_codes.compress(model)
    out["twice"] = error_of(lambda: fsdp_codes.compress(model))
    codes.remove()
    out["after_remove"] = error_of(lambda: fsdp_codes.compress(model))
    grouped = two_param_groups(world)
    out["two_groups"] = error_of(lambda: fsdp_codes.compress(grouped))
    # a gradient in bf16 is accepted for parameters=None under a bf16 all-gather
    out["bf16_gather_grads_only"] = error_of(lambda: fsdp_codes.compress(mlp(world, mp_policy=bf16), parameters=None))
    return out


def bf16_model(world):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8 * world).to(torch.bfloat16)
    fully_shard(model)
    return model


# ---- training ---------------------------------------------------------------------------

def written_bytes():
    """Bytes this process handed to write-type system calls so far."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def train_run(rank, world, gradients, parameters, mesh=None, steps=STEPS):
    corpus = gpt.load_corpus("licenses")
    model = sharded_gpt(CONFIG, 0, mesh)
    codes = fsdp_codes.compress(model, gradients=gradients, parameters=parameters)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    dist.barrier()
    wrote = written_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", fsdp_codes.UncompressedWarning)
        losses, sent = train_steps(model, opt, codes, corpus, steps, batch=BATCH, seed=0)
    wrote = written_bytes() - wrote
    modules = {name: [rs.bytes_sent, ag.bytes_sent]
               for name in codes.module_names for rs, ag in [codes.collectives(name)]}
    return {"losses": losses, "bytes": sent, "wrote": wrote, "residual_bytes": codes.residual_bytes,
            "shard_numels": codes.shard_numels, "modules": modules,
            "by_collective": codes.bytes_by_collective, "uncompressed_calls": codes.uncompressed_calls,
            "warnings": [str(w.message) for w in caught],
            "numel": sum(p.numel() for p in model.parameters())}


def train(rank, world, arrays):
    return {f"{g}/{p}": train_run(rank, world, g, p)
            for g, p in ((None, None), ("int4", "int8"))}


def hsdp(rank, world, arrays):
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    run = train_run(rank, world, "int4", "int8", mesh=mesh, steps=HSDP_STEPS)
    return {"run": run}


# ---- resume -----------------------------------------------------------------------------

def resume(rank, world, arrays):
    corpus = gpt.load_corpus("licenses")
    first, then = 3, 3
    directory = os.environ["DSOPT_FSDP_CKPT"]

    def build():
        model = sharded_gpt(CONFIG, 0)
        codes = fsdp_codes.compress(model, gradients="int4", parameters="int8")
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        return model, codes, opt

    model, codes, opt = build()
    train_steps(model, opt, codes, corpus, first, batch=BATCH, seed=0)
    saved_residual = codes.state_dict()["residuals"]["blocks.0"].to_local().clone()
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd, "codes": codes}, checkpoint_id=directory)
    straight, _ = train_steps(model, opt, codes, corpus, then, batch=BATCH, seed=0, first=first)
    final = [p.to_local().clone() for p in model.parameters()]
    residuals = [r.to_local().clone() for r in codes.state_dict()["residuals"].values()]

    model, codes, opt = build()
    train_steps(model, opt, codes, corpus, 1, batch=BATCH, seed=0, first=100)  # something to overwrite
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd, "codes": codes}
    dcp.load(state, checkpoint_id=directory)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded_residual = codes.state_dict()["residuals"]["blocks.0"].to_local().clone()
    resumed, _ = train_steps(model, opt, codes, corpus, then, batch=BATCH, seed=0, first=first)
    return {
        "straight": straight, "resumed": resumed,
        "residual_loaded": bool(torch.equal(saved_residual, loaded_residual)),
        "residual_nonzero": bool(saved_residual.any()),
        "params_equal": all(torch.equal(a, p.to_local()) for a, p in zip(final, model.parameters())),
        "residuals_equal": all(torch.equal(a, r.to_local()) for a, r in
                               zip(residuals, codes.state_dict()["residuals"].values())),
        "bad_load": error_of(lambda: codes.load_state_dict({**codes.state_dict(), "gradient_block_size": 32})),
    }


CHECKS = {"collectives": collectives, "refusals": refusals, "train": train, "hsdp": hsdp,
          "resume": resume}


def main():
    out_dir, checks = sys.argv[1], sys.argv[2].split(",")
    torch.set_num_threads(1)
    if DEVICE.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if DEVICE.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    arrays, results = {}, {}
    for check in checks:
        results[check] = CHECKS[check](rank, world, arrays)
        dist.barrier()
    dist.destroy_process_group()
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
