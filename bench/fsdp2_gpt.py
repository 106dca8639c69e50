#!/usr/bin/env python3
"""dsopt.torch under PyTorch's FSDP2 on the small GPT of
examples/python/gpt.py (the benchmarks' model; docs/guides/fsdp2.md
"Measured"): at 4 processes (gloo on the CPU, or NCCL with a GPU each),
each its rows of the same global batches, the model sharded block by block
(examples/python/fsdp2_train.py's ``shard``):

1. dsopt.torch.AdamW against torch.optim.AdamW on the same FSDP2 model,
   the same schedule and batches: the largest |difference| of the final
   parameters and of the training losses over the steps; and the same two
   on one process without FSDP2 (how far the two optimizers' roundings
   drift apart by themselves);
2. HSDP 2 x 2 with dsopt.torch.OneBitAdam across the replicas (FSDP2
   within each replica's shard group) against FSDP2 AdamW over 4: the
   validation loss at the same steps;
3. torch.distributed.checkpoint: AdamW saved halfway and resumed by a new
   model and optimizer, against the uninterrupted run (bit for bit?);
4. 2 -> 4: the first half at 2 processes, saved, the second half at 4
   (DCP reshards), against the uninterrupted 4-process run;
5. the optimizer state's bytes on each rank (``memory_usage()``), against
   8 bytes per local element (AdamW's two fp32 moments).

    python3 bench/fsdp2_gpt.py [--steps 300] [--hsdp-steps 300] [--out DIR]

prints a markdown table and writes DIR/fsdp2_gpt.json (default: a
temporary folder).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "bindings" / "python"))
sys.path.insert(0, str(HERE.parent / "examples" / "python"))
import dsopt.torch  # noqa: E402
import fsdp2_train  # noqa: E402
import gpt  # noqa: E402
import local_ranks  # noqa: E402

MODEL, CORPUS, BATCH, LR, SEED = "small", "licenses", 16, 3e-3, 0
MADE = []  # the dsopt optimizers of this process, closed before the process group goes


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50, help="AdamW runs (1, 3, 4)")
    parser.add_argument("--hsdp-steps", type=int, default=300, help="1-bit Adam against AdamW (2)")
    parser.add_argument("--freeze-step", type=int, default=60)
    parser.add_argument("--out", help="folder for the results (default: a temporary one)")
    return parser.parse_args(argv)


def device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def model_and_opt(kind, steps, hsdp=0, freeze_step=60):
    """(model, optimizer, scheduler, rows) for ``kind`` "dsopt" / "torch"
    AdamW or "onebit" (HSDP, ``hsdp`` replicas)."""
    from torch.distributed.device_mesh import init_device_mesh

    world, rank = dist.get_world_size(), dist.get_rank()
    dev = device()
    model = gpt.build_model(MODEL, SEED).to(dev)
    if hsdp:
        mesh = init_device_mesh(dev.type, (hsdp, world // hsdp), mesh_dim_names=("replicate", "shard"))
        fsdp2_train.shard(model, mesh["shard"])
        opt = dsopt.torch.OneBitAdam(model.parameters(), lr=LR, freeze_step=freeze_step)
    else:
        fsdp2_train.shard(model, init_device_mesh(dev.type, (world,)))
        opt = (dsopt.torch.AdamW if kind == "dsopt" else torch.optim.AdamW)(
            model.parameters(), lr=LR, weight_decay=0.01)
    if isinstance(opt, dsopt.torch.Optimizer):
        MADE.append(opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(steps))
    per = BATCH // world
    return model, opt, sched, slice(rank * per, (rank + 1) * per)


def run(model, opt, sched, rows, corpus, first, last):
    """Training losses (mean over ranks) of steps first..last-1."""
    context = gpt.CONFIGS[MODEL].context
    losses = []
    for step in range(first, last):
        x, y = gpt.train_batch(corpus, step, BATCH, context, SEED)
        opt.zero_grad()
        loss = model.loss(x[rows].to(device()), y[rows].to(device()))
        loss.backward()
        opt.step()
        sched.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / dist.get_world_size())
    return losses


def params(model):
    return [p.full_tensor().detach().cpu() for p in model.parameters()]


def max_diff(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def unsharded(steps):
    """dsopt.torch.AdamW against torch.optim.AdamW on one process, no FSDP2,
    the same batches: how far the two drift apart by themselves (largest
    |difference| of the parameters, of the losses)."""
    corpus = gpt.load_corpus(CORPUS)
    context = gpt.CONFIGS[MODEL].context
    runs = []
    for cls in (dsopt.torch.AdamW, torch.optim.AdamW):
        model = gpt.build_model(MODEL, SEED)
        opt = cls(model.parameters(), lr=LR, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(steps))
        losses = []
        for step in range(steps):
            x, y = gpt.train_batch(corpus, step, BATCH, context, SEED)
            opt.zero_grad()
            loss = model.loss(x, y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss))
        runs.append(([p.detach().clone() for p in model.parameters()], losses))
    return {"param_diff": max_diff(runs[0][0], runs[1][0]),
            "loss_diff": max(abs(a - b) for a, b in zip(runs[0][1], runs[1][1]))}


def job(name, args, out, ckpt):
    """One scenario on this process group; rank 0 returns what it found."""
    corpus = gpt.load_corpus(CORPUS)
    context = gpt.CONFIGS[MODEL].context
    steps, half = args.steps, args.steps // 2
    found = {}
    if name == "four":
        runs = {}
        for kind in ("dsopt", "torch"):
            model, opt, sched, rows = model_and_opt(kind, steps)
            started = time.monotonic()
            losses = run(model, opt, sched, rows, corpus, 0, steps)
            runs[kind] = (params(model), losses, time.monotonic() - started)
            if kind == "dsopt":
                memory = opt.memory_usage()
                local = sum(p._local_tensor.numel() for p in model.parameters())
                found["adamw_memory"] = {"bytes": memory["host"] + memory["device"],
                                         "local_numel": local,
                                         "state_bytes": sum(t._local_tensor.numel() * 4
                                                            for s in opt.state.values()
                                                            for k, t in s.items() if k.startswith("exp_"))}
                found["adamw_final"] = (params(model), losses)
        found["dsopt_vs_torch"] = {
            "param_diff": max_diff(runs["dsopt"][0], runs["torch"][0]),
            "loss_diff": max(abs(a - b) for a, b in zip(runs["dsopt"][1], runs["torch"][1])),
            "final_loss": [runs["dsopt"][1][-1], runs["torch"][1][-1]],
            "seconds": [runs["dsopt"][2], runs["torch"][2]]}
        # 3. DCP resume at the same world size
        model, opt, sched, rows = model_and_opt("dsopt", steps)
        run(model, opt, sched, rows, corpus, 0, half)
        fsdp2_train.checkpoint(model, opt, sched, str(ckpt / "four"), load=False)
        model, opt, sched, rows = model_and_opt("dsopt", steps)
        fsdp2_train.checkpoint(model, opt, sched, str(ckpt / "four"), load=True)
        run(model, opt, sched, rows, corpus, sched.last_epoch, steps)
        final = found.pop("adamw_final")
        found["resume"] = {"bit_for_bit": all(map(torch.equal, params(model), final[0])),
                           "param_diff": max_diff(params(model), final[0])}
        # 4. 2 -> 4: the 2-process half saved by job "two"
        model, opt, sched, rows = model_and_opt("dsopt", steps)
        fsdp2_train.checkpoint(model, opt, sched, str(ckpt / "two"), load=True)
        losses = run(model, opt, sched, rows, corpus, sched.last_epoch, steps)
        found["reshard_2_to_4"] = {"param_diff": max_diff(params(model), final[0]),
                                   "losses_after": [losses[0], losses[-1]],
                                   "uninterrupted": [final[1][half], final[1][-1]]}
        # 2. HSDP 2 x 2, 1-bit Adam, against FSDP2 AdamW
        hs = args.hsdp_steps
        val = {}
        for kind, hsdp in (("dsopt", 0), ("onebit", 2)):
            model, opt, sched, rows = model_and_opt(kind, hs, hsdp, args.freeze_step)
            started = time.monotonic()
            losses = run(model, opt, sched, rows, corpus, 0, hs)
            local = sum(p._local_tensor.numel() for g in opt.param_groups for p in g["params"])
            val[kind] = {"validation": gpt.validation_loss(model, corpus, context),
                         "train_last": sum(losses[-20:]) / 20, "seconds": time.monotonic() - started,
                         "compressed": bool(getattr(opt.last_step_info, "compressed", False))}
            if kind == "onebit":
                memory = opt.memory_usage()
                val[kind]["memory"] = memory["host"] + memory["device"]
                val[kind]["local_numel"] = local
        found["hsdp"] = val
    elif name == "two":
        model, opt, sched, rows = model_and_opt("dsopt", steps)
        run(model, opt, sched, rows, corpus, 0, half)
        fsdp2_train.checkpoint(model, opt, sched, str(ckpt / "two"), load=False)
    memory = []
    if "adamw_memory" in found:  # every rank's
        mine = torch.tensor([found["adamw_memory"]["bytes"], found["adamw_memory"]["local_numel"]])
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        memory = [t.tolist() for t in every]
        found["adamw_memory"]["every_rank"] = memory
    return found


def _spawned(name, args, out, ckpt):
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.set_num_threads(1)
    found = job(name, args, out, ckpt)
    for opt in MADE:  # collective, in the same order on every rank, before the group goes
        opt.close()
    if rank == 0:
        (out / f"{name}.json").write_text(json.dumps(found))
    dist.barrier()
    dist.destroy_process_group()


def launch(name, world, args, out, ckpt):
    local_ranks.spawn(_spawned, world, name, args, out, ckpt)
    return json.loads((out / f"{name}.json").read_text())


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="fsdp2_gpt_"))
    out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(tempfile.mkdtemp(prefix="fsdp2_gpt_ckpt_"))
    try:
        launch("two", 2, args, out, ckpt)
        found = launch("four", 4, args, out, ckpt)
    finally:
        shutil.rmtree(ckpt, ignore_errors=True)
    found["unsharded"] = unsharded(args.steps)
    found["machine"] = {"torch": torch.__version__, "cpus": os.cpu_count(),
                        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                        "steps": args.steps, "hsdp_steps": args.hsdp_steps,
                        "freeze_step": args.freeze_step, "model": MODEL, "batch": BATCH}
    (out / "fsdp2_gpt.json").write_text(json.dumps(found, indent=1))
    d, r, h = found["dsopt_vs_torch"], found["reshard_2_to_4"], found["hsdp"]
    mem = found["adamw_memory"]
    ratio = h["onebit"]["validation"] / h["dsopt"]["validation"]
    rows = [
        ("AdamW, dsopt vs torch (FSDP2, 4 procs, "
         f"{args.steps} steps)", f"largest param difference {d['param_diff']:.2e}, largest loss difference "
         f"{d['loss_diff']:.2e}, final loss {d['final_loss'][0]:.4f} / {d['final_loss'][1]:.4f}"),
        (f"AdamW, dsopt vs torch, one process without FSDP2 ({args.steps} steps)",
         f"largest param difference {found['unsharded']['param_diff']:.2e}, largest loss "
         f"difference {found['unsharded']['loss_diff']:.2e}"),
        (f"HSDP 2 x 2 1-bit Adam vs FSDP2 AdamW ({args.hsdp_steps} steps, freeze "
         f"{args.freeze_step})", f"validation {h['onebit']['validation']:.4f} vs "
         f"{h['dsopt']['validation']:.4f} (ratio {ratio:.4f})"),
        ("DCP resume at step " + str(args.steps // 2), f"bit for bit: {found['resume']['bit_for_bit']} "
         f"(largest difference {found['resume']['param_diff']:.1e})"),
        ("2 -> 4 resharding at step " + str(args.steps // 2),
         f"loss {r['losses_after'][0]:.4f} -> {r['losses_after'][1]:.4f} (uninterrupted "
         f"{r['uninterrupted'][0]:.4f} -> {r['uninterrupted'][1]:.4f}), largest param difference "
         f"{r['param_diff']:.2e}"),
        ("optimizer state per rank (AdamW, 4 procs)",
         ", ".join(f"{b:,} B ({b / n:.1f} B/elem)" for b, n in mem["every_rank"])),
        ("optimizer state per rank (1-bit Adam, HSDP 2 x 2)",
         f"{h['onebit']['memory']:,} B on rank 0 ({h['onebit']['memory'] / h['onebit']['local_numel']:.1f} "
         f"B/elem)"),
    ]
    print("| check | result |\n| --- | --- |")
    for check, result in rows:
        print(f"| {check} | {result} |")
    print(f"\n{out / 'fsdp2_gpt.json'}")


if __name__ == "__main__":
    main()
