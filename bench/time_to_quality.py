#!/usr/bin/env python3
"""Time to AdamW's loss: data-parallel training of a bandwidth-bound GPT
(examples/python/gpt.py) with dsopt.torch's AdamW and its 1-bit optimizers
(and, when ``--optimizers`` names them, Lion and AdamW under compressed ZeRO
stage 2: ``ZeRO2-int4/int8``, ``ZeRO2-sign/int8``, the gradient / parameter
codecs of docs/guides/compressed-zero.md) over mpi4py's COMM_WORLD, every
optimizer from the same initial weights on the same batches.

    mpirun -np 4 python3 bench/time_to_quality.py --out DIR

(``bench/run_benchmarks.sh`` runs it on 4 ranks on the emulated 1 Gbit/s
link of ``bench/netem.sh``.) ``--topology HIERARCHY[:R]`` gives every
optimizer the config's ``"topology"`` (docs/guides/multi-node.md):
``node_aware:2`` runs the compressed collectives node-aware with the ranks
declared as nodes of 2 (``{"hierarchy": "node_aware", "ranks_per_node": 2}``),
``flat`` the flat form; without it the library's default (``"auto"``).
``--node-reduce 1bit`` adds ``"node_reduce": "1bit"`` (the node-aware 1-bit
allreduce's 1-bit node step) to the topology of the 1-bit family.

AdamW trains ``--steps`` N steps; its validation loss after them is the
target. Each other optimizer then trains until its validation loss first
reaches the target, N steps at least (its loss after N steps is reported
too), ``--cap`` x N steps at most. Settings, as a user would write them:
lr 1e-3 (1e-2 for 1-bit LAMB), ``freeze_step`` (1-bit Adam, 1-bit LAMB) and
``var_freeze_step`` (0/1 Adam) at 15% of N; Lion at the stronger end of
its paper's advice against AdamW's lr 1e-3 and weight decay 0.01: lr 1e-4
(3-10x smaller) and weight decay 0.1 (3-10x larger: the same decay per
step, lr x weight decay), betas (0.9, 0.99), the best of the settings in
docs/optimizers/lion.md; ``--lr NAME=LR``, ``--wd NAME=WD`` and
``--betas NAME=B1,B2`` set others. Every other
argument is at the dsopt.torch class's default (the compressed ZeRO runs:
AdamW's); each optimizer is a ``dsopt.torch.Optimizer`` made from the config
that class builds, with ``"zero_optimization"`` and ``"topology"`` added
where asked; the learning rate warms up linearly over the first 10% of
N, then follows a cosine to 10% of its peak at step N (and stays there),
through ``torch.optim.lr_scheduler.LambdaLR``; one torch thread per rank.

The loss measure is the validation loss of ``gpt.validation_loss`` (fixed
held-out windows) of rank 0's parameters, every ``--eval-every`` steps. The
clock runs only over training: each stretch of ``--eval-every`` steps is
timed between two barriers of all ranks (forward, backward,
``optimizer.step()``, the schedule), and rank 0 evaluates between
stretches while the others wait outside the clock. The time to the target is
the clock at the first evaluation at or below it.

Reported per optimizer: steps and seconds to the target, AdamW's seconds
over them (the speedup), the loss after N steps, ``StepInfo.bytes_sent`` per
rank up to the target (and, where some cross nodes, ``bytes_inter_node``),
skipped steps, the steps of each phase (full
precision, 1-bit, local, sync), the median seconds of a step's compute
(batch, forward, backward) and of ``optimizer.step()`` by phase (means over
the ranks), and how much of the time to the target went to full-precision
steps and to compute. A Markdown table on stdout, everything in ``DIR/time_to_quality.json``.
"""
import argparse
import inspect
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "python"))
import gpt  # noqa: E402

OPTIMIZERS = ["AdamW", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"]  # the default
# name -> (gradient codec, parameter codec) of AdamW under ZeRO stage 2
COMPRESSED_ZERO = {"ZeRO2-int4/int8": ("int4", "int8"), "ZeRO2-sign/int8": ("sign", "int8")}
CHOICES = OPTIMIZERS + ["Lion", *COMPRESSED_ZERO]
LEARNING_RATES = {"AdamW": 1e-3, "OneBitAdam": 1e-3, "ZeroOneAdam": 1e-3, "OneBitLamb": 1e-2, "Lion": 1e-4,
                  **{name: 1e-3 for name in COMPRESSED_ZERO}}
# the hyperparameters whose defaults the dsopt.torch classes set (AdamW's
# weight decay 0.01, where its config's is 0)
CLASS_HYPERPARAMETERS = ("lr", "betas", "eps", "weight_decay")
HIERARCHIES = ("auto", "flat", "node_aware")
ONEBIT_FAMILY = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb")
WEIGHT_DECAY = {"Lion": 0.1}  # the others: the class's default
FREEZE_ARGUMENT = {"OneBitAdam": "freeze_step", "OneBitLamb": "freeze_step", "ZeroOneAdam": "var_freeze_step"}
FREEZE_FRACTION = 0.15
PHASES = ["full", "1-bit", "local", "sync", "skipped"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for time_to_quality.json")
    p.add_argument("--steps", type=int, default=300, help="AdamW's steps N (default 300)")
    p.add_argument("--cap", type=float, default=2.0, help="a run after AdamW's stops after cap x N steps (default 2)")
    p.add_argument("--eval-every", type=int, default=10, help="steps between validation losses (default 10)")
    p.add_argument("--eval-windows", type=int, default=256,
                   help="held-out windows of the validation loss (default 256)")
    p.add_argument("--batch", type=int, default=8, help="sequences per global batch (default 8)")
    p.add_argument("--context", type=int, default=16)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--corpus", default="licenses", choices=sorted(gpt.CORPUS_FILES))
    p.add_argument("--seed", type=int, default=0, help="initial weights and batches")
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                   help=f"comma-separated, AdamW first, of {', '.join(CHOICES)} "
                        f"(default: {', '.join(OPTIMIZERS)})")
    p.add_argument("--lr", action="append", default=[], metavar="NAME=LR",
                   help="another peak learning rate for optimizer NAME (repeatable)")
    p.add_argument("--wd", action="append", default=[], metavar="NAME=WD",
                   help="another weight decay for optimizer NAME (repeatable)")
    p.add_argument("--betas", action="append", default=[], metavar="NAME=B1,B2",
                   help="other betas for optimizer NAME (repeatable)")
    p.add_argument("--topology", default=None, metavar="HIERARCHY[:R]",
                   help=f"the config's topology for every optimizer: HIERARCHY one of {', '.join(HIERARCHIES)}, "
                        f"R ranks per node (declared; default: found from the communicator); "
                        f"default: none given (the library's auto)")
    p.add_argument("--node-reduce", default=None, choices=("fp32", "1bit"),
                   help='the topology\'s "node_reduce" for the 1-bit family (with --topology)')
    args = p.parse_args(argv)
    args.topology = parse_topology(p, args.topology)
    if args.node_reduce is not None:
        if args.topology is None:
            p.error("--node-reduce needs --topology")
        args.topology["node_reduce"] = args.node_reduce
    args.optimizers = args.optimizers.split(",")
    if args.optimizers[0] != "AdamW" or not set(args.optimizers) <= set(CHOICES):
        p.error(f"--optimizers: AdamW first, then any of {CHOICES[1:]}")
    args.lr = dict(parse_override(p, "lr", text, parse_positive, "LR (> 0)") for text in args.lr)
    args.wd = dict(parse_override(p, "wd", text, parse_non_negative, "WD (>= 0)") for text in args.wd)
    args.betas = dict(parse_override(p, "betas", text, parse_betas, "B1,B2 (each in [0, 1))") for text in args.betas)
    if args.steps % args.eval_every:
        p.error("--steps must be a multiple of --eval-every (AdamW's last step is evaluated)")
    return args


def parse_topology(parser, text):
    """The config's "topology" section of ``--topology HIERARCHY[:R]`` (None: not given)."""
    if text is None:
        return None
    hierarchy, _, ranks = text.partition(":")
    if hierarchy not in HIERARCHIES or (ranks and not (ranks.isdigit() and int(ranks) >= 1)):
        parser.error(f"--topology {text}: HIERARCHY[:R] with HIERARCHY one of {HIERARCHIES}, R an integer >= 1")
    topology = {"hierarchy": hierarchy}
    if ranks:
        topology["ranks_per_node"] = int(ranks)
    return topology


def parse_override(parser, option, text, value, what):
    """(name, value) of ``--OPTION NAME=VALUE``; `value` parses VALUE (None: invalid)."""
    name, _, rest = text.partition("=")
    try:
        parsed = value(rest)
    except ValueError:
        parsed = None
    if name not in CHOICES or parsed is None:
        parser.error(f"--{option} {text}: NAME={what} with NAME one of {CHOICES}")
    return name, parsed


def parse_positive(text):
    x = float(text)
    return x if x > 0 else None


def parse_non_negative(text):
    x = float(text)
    return x if x >= 0 else None


def parse_betas(text):
    b = tuple(float(x) for x in text.split(","))
    return b if len(b) == 2 and all(0 <= x < 1 for x in b) else None


def optimizer_kwargs(name, steps, lrs=None, wds=None, betas=None):
    kwargs = {"lr": (lrs or {}).get(name, LEARNING_RATES[name])}
    if name in (betas or {}):
        kwargs["betas"] = betas[name]
    wd = (wds or {}).get(name, WEIGHT_DECAY.get(name))
    if wd is not None:
        kwargs["weight_decay"] = wd
    if name in FREEZE_ARGUMENT:
        kwargs[FREEZE_ARGUMENT[name]] = max(1, round(FREEZE_FRACTION * steps))
    return kwargs


def optimizer_config(name, kwargs, topology=None):
    """The dsopt config of optimizer `name` with the torch-style `kwargs`:
    the config its dsopt.torch class builds from them (lr, betas, eps and
    weight decay at the class's defaults unless given; the other settings'
    defaults are the config's, as the class's), plus ZeRO stage 2 with its
    codecs for the compressed ZeRO names and `topology` when given."""
    import dsopt.torch

    algorithm = "AdamW" if name in COMPRESSED_ZERO else name
    signature = inspect.signature(getattr(dsopt.torch, algorithm)).parameters
    params = {key: signature[key].default for key in CLASS_HYPERPARAMETERS if key in signature}
    params.update(kwargs)
    if "betas" in params:
        params["betas"] = list(params["betas"])
    config = {"optimizer": {"type": algorithm, "params": params}}
    if name in COMPRESSED_ZERO:
        gradients, parameters = COMPRESSED_ZERO[name]
        config["zero_optimization"] = {"stage": 2, "compression": {"gradients": gradients, "parameters": parameters}}
    if topology is not None:
        config["topology"] = dict(topology)
        if name not in ONEBIT_FAMILY:  # "node_reduce" is the 1-bit allreduce's
            config["topology"].pop("node_reduce", None)
    return config


def phase_name(info):
    import dsopt
    if info.skipped:
        return "skipped"
    return {dsopt.PHASE_FULL: "full", dsopt.PHASE_COMPRESSED: "1-bit", dsopt.PHASE_LOCAL: "local",
            dsopt.PHASE_SYNC: "sync", dsopt.PHASE_SKIPPED: "skipped"}[info.phase]


def wait_idle(world):
    """A barrier whose waiting ranks sleep instead of spinning in MPI, so
    that rank 0's evaluation gets a whole core (the ranks share the cores)."""
    request = world.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def blas_of_torch():
    """The BLAS torch was built with (``BLAS_INFO`` of its build settings).
    "generic" is the system's libblas.so.3 (Debian's torch; the reference
    BLAS unless OpenBLAS is installed), whose matrix products are many times
    slower than MKL's: the model's compute then takes a larger share of the
    step."""
    import torch
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def train(name, args, config, corpus, world, target=None):
    """Trains one optimizer on every rank; returns rank 0's record (None on
    the other ranks). Without `target` (AdamW): N steps. With it: until the
    validation loss is at or below it and N steps are done, or the cap."""
    import torch

    import dsopt
    import dsopt.torch

    rank, size = world.Get_rank(), world.Get_size()
    local = args.batch // size
    model = gpt.build_model(config, args.seed)
    kwargs = optimizer_kwargs(name, args.steps, args.lr, args.wd, args.betas)
    opt = dsopt.torch.Optimizer(model.parameters(), optimizer_config(name, kwargs, args.topology), comm=world)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, gpt.warmup_cosine(args.steps))
    max_steps = args.steps if target is None else int(args.cap * args.steps)
    steps = {"compute": [], "step": [], "phase": [], "bytes": [], "inter_node": []}  # this rank's, per step
    evals = []  # [step, clock seconds, validation loss] (rank 0's loss, sent to all)
    reached = None
    error = ""

    def evaluate(step, clock):
        loss = gpt.validation_loss(model, corpus, config.context, args.eval_windows) if rank == 0 else None
        wait_idle(world)
        loss = world.bcast(loss, root=0)
        evals.append([step, clock, loss])
        return loss

    clock, step = 0.0, 0
    evaluate(0, 0.0)
    while step < max_steps and not error:
        world.Barrier()
        start = time.perf_counter()
        for _ in range(args.eval_every):
            t0 = time.perf_counter()
            x, y = gpt.train_batch(corpus, step, args.batch, config.context, args.seed)
            opt.zero_grad(set_to_none=True)
            model.loss(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]).backward()
            t1 = time.perf_counter()
            try:
                opt.step()
            except dsopt.NonFiniteError as e:
                error = f"step {step + 1}: {e}"
            t2 = time.perf_counter()
            info = opt.last_step_info
            steps["compute"].append(t1 - t0)
            steps["step"].append(t2 - t1)
            steps["phase"].append(phase_name(info))
            steps["bytes"].append(info.bytes_sent)
            steps["inter_node"].append(info.bytes_inter_node)
            schedule.step()
            step += 1
            if error:
                break
        world.Barrier()
        clock += time.perf_counter() - start
        loss = evaluate(step, clock)
        if target is not None and reached is None and loss <= target:
            reached = [step, clock, loss]
        if target is not None and reached is not None and step >= args.steps:
            break
    opt.close()
    every = world.gather(steps, root=0)
    if rank != 0:
        return None
    return summarize(name, kwargs, args, evals, every, reached, target, error)


def summarize(name, kwargs, args, evals, every, reached, target, error):
    """Rank 0's record of one optimizer from every rank's per-step lists.
    Per-step seconds are means over the ranks: a step ends in collectives,
    so each rank's step lasts about as long on the clock, and the slowest
    rank's compute shows up as the others' wait inside optimizer.step()."""
    done = len(every[0]["step"])
    compute = [statistics.fmean(r["compute"][i] for r in every) for i in range(done)]
    whole = [statistics.fmean(r["compute"][i] + r["step"][i] for r in every) for i in range(done)]
    phases = every[0]["phase"]
    present = [p for p in PHASES if p in phases]

    def median_of(values, phase):
        return statistics.median(v for v, p in zip(values, phases) if p == phase)

    at_n = next((e for e in evals if e[0] == args.steps), None)
    record = {
        "optimizer": name, "kwargs": kwargs, "steps_run": done, "evals": evals,
        "loss_at_n": at_n[2] if at_n else None, "seconds_at_n": at_n[1] if at_n else None,
        "error": error,
        "skipped_steps": sum(p == "skipped" for p in phases),
        "phase_steps": {p: phases.count(p) for p in present},
        "compute_median_s": statistics.median(compute),
        "step_median_s_by_phase": {p: median_of([w - c for w, c in zip(whole, compute)], p) for p in present},
        "whole_step_median_s_by_phase": {p: median_of(whole, p) for p in present},
        "bytes_sent_per_rank_total": [sum(r["bytes"]) for r in every],
        "bytes_inter_node_per_rank_total": [sum(r["inter_node"]) for r in every],
    }
    if target is None:  # AdamW: its run is the reference
        reached = [args.steps, evals[-1][1], evals[-1][2]]
    record["reached"] = reached is not None
    if reached:
        n = reached[0]
        record.update(steps_to_target=n, seconds_to_target=reached[1], loss_at_target=reached[2],
                      bytes_sent_per_rank_to_target=[sum(r["bytes"][:n]) for r in every],
                      bytes_inter_node_per_rank_to_target=[sum(r["inter_node"][:n]) for r in every],
                      full_steps_to_target=sum(p == "full" for p in phases[:n]),
                      seconds_in_full_steps_to_target=sum(w for w, p in zip(whole[:n], phases) if p == "full"),
                      seconds_in_compute_to_target=sum(compute[:n]))
    return record


def markdown(result):
    base = result["runs"][0]
    rows = ["| optimizer | steps to AdamW's loss | s to AdamW's loss | AdamW s / s | "
            f"val loss after {result['setup']['steps']} steps | bytes sent per rank to the loss | skipped steps |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["runs"]:
        if r["reached"]:
            cells = [str(r["steps_to_target"]), f"{r['seconds_to_target']:.1f}",
                     f"{base['seconds_to_target'] / r['seconds_to_target']:.2f}x"]
            sent = f"{statistics.median(r['bytes_sent_per_rank_to_target']):.3g}"
            across = statistics.median(r["bytes_inter_node_per_rank_to_target"])
        else:
            cells = [f"not within {r['steps_run']}", f"> {r['evals'][-1][1]:.1f}", "-"]
            sent = f"{statistics.median(r['bytes_sent_per_rank_total']):.3g} (all {r['steps_run']})"
            across = statistics.median(r["bytes_inter_node_per_rank_total"])
        if across:
            sent += f" ({across:.3g} across nodes)"
        loss_n = "-" if r["loss_at_n"] is None else f"{r['loss_at_n']:.4f}"
        rows.append(f"| {r['optimizer']} | " + " | ".join(cells) + f" | {loss_n} | {sent} | "
                    f"{r['skipped_steps']}{' (' + r['error'] + ')' if r['error'] else ''} |")
    rows += ["", "| optimizer | steps by phase (whole run) | compute s (median) | "
             "optimizer.step() s by phase (median) | s in full-precision steps to the loss | "
             "s in compute to the loss |",
             "| --- | --- | ---: | --- | ---: | ---: |"]
    for r in result["runs"]:
        phases = ", ".join(f"{p} {n}" for p, n in r["phase_steps"].items())
        step_s = ", ".join(f"{p} {s:.3f}" for p, s in r["step_median_s_by_phase"].items())
        if r["reached"]:
            spent = f"{r['seconds_in_full_steps_to_target']:.1f} | {r['seconds_in_compute_to_target']:.1f}"
        else:
            spent = "- | -"
        rows.append(f"| {r['optimizer']} | {phases} | {r['compute_median_s']:.3f} | {step_s} | {spent} |")
    return "\n".join(rows)


def main(argv=None):
    import os

    import torch
    from mpi4py import MPI

    args = parse_args(argv)
    torch.set_num_threads(1)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if args.batch % size:
        raise SystemExit(f"--batch {args.batch} does not split over {size} ranks")
    config = gpt.GPTConfig(context=args.context, width=args.width, depth=args.depth, heads=args.heads)
    corpus = gpt.load_corpus(args.corpus)
    params = sum(p.numel() for p in gpt.build_model(config, args.seed).parameters())
    setup = {"ranks": size, "parameters": params, "config": vars(config), "steps": args.steps, "cap": args.cap,
             "batch": args.batch, "batch_per_rank": args.batch // size, "eval_every": args.eval_every,
             "eval_windows": args.eval_windows, "corpus": args.corpus, "seed": args.seed,
             "freeze_fraction": FREEZE_FRACTION, "warmup_fraction": gpt.WARMUP_FRACTION,
             "final_lr_fraction": gpt.FINAL_LR_FRACTION, "python": sys.executable, "torch": torch.__version__,
             "torch_blas": blas_of_torch(), "cpus": os.cpu_count(),
             "loadavg_at_start": os.getloadavg(),
             "network": os.environ.get("DSOPT_BENCH_NETWORK", "not given (DSOPT_BENCH_NETWORK unset)"),
             "topology": args.topology}
    if rank == 0:
        print(f"time_to_quality: GPT {vars(config)}, {params:,} parameters, {size} ranks, batch {args.batch} "
              f"({args.batch // size} per rank), AdamW {args.steps} steps; torch {torch.__version__} "
              f"(BLAS {setup['torch_blas']}) under {sys.executable}; network: {setup['network']}; "
              f"topology: {args.topology or 'not given (auto)'}", flush=True)
    wall = time.perf_counter()
    runs, target = [], None
    for name in args.optimizers:
        record = train(name, args, config, corpus, world, target)
        if rank == 0:
            runs.append(record)
            if target is None:
                target = record["loss_at_target"]
            print(f"time_to_quality: {name} done: {record['steps_run']} steps, "
                  f"{'reached' if record['reached'] else 'did not reach'} {target:.4f}", flush=True)
        target = world.bcast(target, root=0)
    if rank == 0:
        result = {"setup": setup, "target_loss": target, "runs": runs, "wall_s": time.perf_counter() - wall,
                  "loadavg_at_end": os.getloadavg()}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "time_to_quality.json").write_text(json.dumps(result, indent=1))
        print(markdown(result))
        loads = [" ".join(f"{x:.2f}" for x in load) for load in (setup["loadavg_at_start"], result["loadavg_at_end"])]
        print(f"time_to_quality: {result['wall_s']:.0f} s in all; load average (1, 5, 15 min) {loads[0]} at the "
              f"start, {loads[1]} at the end ({os.cpu_count()} CPUs); {out / 'time_to_quality.json'}")


if __name__ == "__main__":
    main()
