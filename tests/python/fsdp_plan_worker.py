"""One rank of test_fsdp_plan.py: the small GPT of examples/python/gpt.py
under FSDP2 (every block and the model ``fully_shard``ed), dsopt.torch.AdamW
on its shards, two steps with FSDP2's collectives counted and with each
codec pair of dsopt.torch.fsdp; per pair the bytes of the second step
(``Compression.bytes_sent``), the shard sizes and residual bytes, and
dsopt's memory; and the model's FSDP modules as the planner reads them
(``Model.from_fsdp``). At 4 ranks also HSDP 2 x 2 (``hsdp``): per 1-bit
optimizer across the replicas each step's FSDP2 bytes, dsopt's
(``StepInfo.bytes_sent``) and whether it compressed, and dsopt's memory.

    RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python fsdp_plan_worker.py OUT_DIR

writes OUT_DIR/rank<RANK>.json."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import dsopt.torch
import dsopt.torch.fsdp as fsdp_codes
from dsopt.plan import Model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import gpt  # noqa: E402
from fsdp2_compressed_train import sharded_gpt, train_steps  # noqa: E402

# Every gradient and parameter codec, uncompressed included, in 7 pairs.
PAIRS = [(None, None), ("int8", "bf16"), ("int8", "int8"), ("int4", "int8"), ("sign", "int8"),
         ("sign", None), (None, "bf16")]

# HSDP 2 x 2 at 4 ranks: 1-bit Adam and 0/1 Adam across the replicas, two
# warmup steps, then compressed ones.
HSDP = {"OneBitAdam": dict(freeze_step=2), "ZeroOneAdam": dict(var_freeze_step=2)}


def run(corpus, gradients, parameters):
    model = sharded_gpt("tiny", 0)
    codes = fsdp_codes.compress(model, gradients=gradients, parameters=parameters)
    opt = dsopt.torch.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    _, sent = train_steps(model, opt, codes, corpus, 2, batch=8, seed=0)
    out = {"bytes": sent[-1], "shard_numels": list(codes.shard_numels.values()),
           "residual_bytes": codes.residual_bytes, "memory": opt.memory_usage()["host"],
           "state": opt.dsopt.state_memory_usage()["host"],
           "modules": [[list(map(list, m.shapes)), m.reshard] for m in Model.from_fsdp(model).modules],
           "local": sum(p.to_local().numel() for p in model.parameters())}
    opt.close()
    return out


def hsdp(corpus, name, kw):
    """HSDP 2 x 2 (fully_shard over the mesh's shard dimension, dsopt's
    ``name`` across the replicas), FSDP2's collectives counted: per step
    FSDP2's bytes, dsopt's (``StepInfo.bytes_sent``) and whether it
    compressed, and dsopt's memory."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = sharded_gpt("tiny", 0, mesh=mesh["shard"])
    codes = fsdp_codes.compress(model, gradients=None, parameters=None)
    opt = getattr(dsopt.torch, name)(model.parameters(), lr=1e-3, **kw)
    steps = []
    for step in range(4):
        _, sent = train_steps(model, opt, codes, corpus, 1, batch=8, seed=0, first=step)
        info = opt.last_step_info
        steps.append({"fsdp": sent[0], "dsopt": info.bytes_sent, "inter": info.bytes_inter_node,
                      "compressed": bool(info.compressed)})
    out = {"steps": steps, "memory": opt.memory_usage()["host"],
           "state": opt.dsopt.state_memory_usage()["host"],
           "local": sum(p.to_local().numel() for p in model.parameters()),
           "modules": [[list(map(list, m.shapes)), m.reshard] for m in Model.from_fsdp(model).modules]}
    opt.close()
    return out


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    corpus = gpt.load_corpus("licenses")
    results = {f"{g or 'none'}/{p or 'none'}": run(corpus, g, p) for g, p in PAIRS}
    if dist.get_world_size() == 4:
        results["hsdp"] = {name: hsdp(corpus, name, kw) for name, kw in HSDP.items()}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
