"""One rank of test_fsdp_plan.py: the small GPT of examples/python/gpt.py
under FSDP2 (every block and the model ``fully_shard``ed), dsopt.torch.AdamW
on its shards, two steps with FSDP2's collectives counted and with each
codec pair of dsopt.torch.fsdp; per pair the bytes of the second step
(``Compression.bytes_sent``), the shard sizes and residual bytes, and
dsopt's memory; and the model's FSDP modules as the planner reads them
(``Model.from_fsdp``).

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


def main():
    out_dir = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    corpus = gpt.load_corpus("licenses")
    results = {f"{g or 'none'}/{p or 'none'}": run(corpus, g, p) for g, p in PAIRS}
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
