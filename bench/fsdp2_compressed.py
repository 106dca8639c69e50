#!/usr/bin/env python3
"""FSDP2's collectives compressed with dsopt's codes on the GPT of
``examples/python/gpt.py``: the same model, weights and batches trained
under ``fully_shard`` (every block and the model) with torch.optim.AdamW,
once with FSDP2's own collectives (their bytes counted) and once per codec
pair of ``dsopt.torch.fsdp.compress`` (int4/int8, int8/int8, sign/int8,
and what ``--pairs`` adds), over gloo on the CPU.

    python3 bench/fsdp2_compressed.py [--ranks 4] [--steps 150] [--seeds 3] [--json FILE]

Starts the ranks itself (as torchrun's variables would). Reported per
pair, over the seeds (mean and min-max): the final loss (the mean of the
last 10 steps' global-batch losses, every pair on the same batches), the
validation loss at the end, the bytes each rank sent per step in FSDP2's
reduce-scatters and all-gathers (dsopt.torch.fsdp's count: the same every
step and every seed), how many times fewer than uncompressed, the bytes
this process wrote to its sockets per step (/proc/self/io, gloo's framing
included), the residuals' memory and the seconds per step. Rows go to
stdout as a markdown table (docs/guides/fsdp2-compression.md "Measured")."""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "python"))
import fsdp2_compressed_train as fsdp2_train  # noqa: E402
import gpt  # noqa: E402

TAIL = 10
PAIRS = ["none/none", "int4/int8", "int8/int8", "sign/int8"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--config", default="small", choices=sorted(gpt.CONFIGS))
    p.add_argument("--pairs", nargs="*", default=[], help="more gradients/parameters pairs (e.g. int4/bf16)")
    p.add_argument("--json", help="write the runs to this file")
    return p.parse_args(argv)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def written_bytes():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar:")).split()[1])


def run(pair, seed, args, corpus):
    import torch
    import torch.distributed as dist
    import dsopt.torch.fsdp
    gradients, parameters = (fsdp2_train.codec_arg(c) for c in pair.split("/"))
    model = fsdp2_train.sharded_gpt(args.config, seed)
    codes = dsopt.torch.fsdp.compress(model, gradients=gradients, parameters=parameters)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    dist.barrier()
    wrote, start = written_bytes(), time.perf_counter()
    losses, sent = fsdp2_train.train_steps(model, opt, codes, corpus, args.steps, batch=args.batch, seed=seed)
    seconds = (time.perf_counter() - start) / args.steps
    wrote = written_bytes() - wrote
    return {"pair": pair, "seed": seed, "final": statistics.mean(losses[-TAIL:]), "losses": losses,
            "validation": gpt.validation_loss(model, corpus, model.config.context),
            "bytes": sent[-1], "bytes_constant": len(set(sent)) == 1, "wrote": wrote / args.steps,
            "residual_bytes": codes.residual_bytes, "seconds": seconds,
            "uncompressed_calls": codes.uncompressed_calls}


def rank_main(args):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    corpus = gpt.load_corpus("licenses")
    runs = [run(pair, seed, args, corpus) for seed in range(args.seeds) for pair in PAIRS + args.pairs]
    if dist.get_rank() == 0:
        out = {"ranks": dist.get_world_size(), "torch": torch.__version__, "machine": cpu_model(), "cpus": os.cpu_count(), "args": vars(args), "runs": runs}
        Path(os.environ["DSOPT_BENCH_OUT"]).write_text(json.dumps(out))
    dist.destroy_process_group()


def spread(values, fmt):
    mean = statistics.mean(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def report(result):
    runs = result["runs"]
    pairs = list(dict.fromkeys(r["pair"] for r in runs))
    base_bytes = next(r["bytes"] for r in runs if r["pair"] == "none/none")
    print(f"{result['ranks']} ranks (gloo, CPU: {result['cpus']} cores, {result['machine']}), torch "
          f"{result['torch']}, GPT '{result['args']['config']}', {result['args']['steps']} steps, "
          f"{result['args']['seeds']} seed(s); final loss = mean of the last {TAIL} steps\n")
    print("| gradients / parameters | final loss | vs uncompressed | validation loss | bytes per step "
          "per rank | x fewer | socket bytes per step | residuals (bytes) | s per step |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    base_final = {r["seed"]: r["final"] for r in runs if r["pair"] == "none/none"}
    for pair in pairs:
        rs = [r for r in runs if r["pair"] == pair]
        assert all(r["bytes_constant"] and r["bytes"] == rs[0]["bytes"] for r in rs), pair
        ratio = [r["final"] / base_final[r["seed"]] for r in rs]
        print(f"| {pair.replace('none', 'FSDP2').replace('FSDP2/FSDP2', 'uncompressed (FSDP2)')} "
              f"| {spread([r['final'] for r in rs], '.4f')} | {spread(ratio, '.3f')} "
              f"| {spread([r['validation'] for r in rs], '.4f')} | {rs[0]['bytes']:,} "
              f"| {base_bytes / rs[0]['bytes']:.2f} | {spread([r['wrote'] for r in rs], ',.0f')} "
              f"| {rs[0]['residual_bytes']:,} | {spread([r['seconds'] for r in rs], '.3f')} |")


def main(argv=None):
    args = parse_args(argv)
    if "RANK" in os.environ:
        rank_main(args)
        return
    out = Path(args.json) if args.json else Path(f"/tmp/fsdp2_compressed_{os.getpid()}.json")
    os.environ["DSOPT_BENCH_OUT"] = str(out.resolve())
    fsdp2_train.launch(Path(__file__), args.ranks, argv if argv is not None else sys.argv[1:])
    report(json.loads(out.read_text()))


if __name__ == "__main__":
    main()
