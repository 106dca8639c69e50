"""python -m dsopt.plan: the planner's command (docs/guides/planner.md)."""

import argparse
import re
import sys

from .algorithms import names as algorithm_names
from .configs import Settings, all_configs, by_name, fsdp_configs
from .model import Model
from .network import Cluster
from .planner import choose, plan
from .profile import load as load_profile, save as save_profile
from .report import CALLER_NOTE, NOTES, plot, table
from .units import parse_count, parse_time


def parser():
    p = argparse.ArgumentParser(prog="python -m dsopt.plan", description=(
        "Will it help on my cluster? Predicts the bytes each rank sends per step, the memory each rank holds and "
        "the step time of every dsopt configuration, and chooses one (docs/guides/planner.md)."))
    m = p.add_argument_group("model")
    m.add_argument("--params", help="parameter count (1.3e9, 350M, 7B)")
    m.add_argument("--sizes", help="comma-separated tensor sizes instead of --params")
    m.add_argument("--tensors", help="with --params: cut into this many tensors (default: tensors of at most "
                   "2^24 elements)")
    m.add_argument("--dtype", default="fp32", help="parameters' dtype: fp32, bf16, fp16 (default fp32)")
    c = p.add_argument_group("cluster")
    c.add_argument("--ranks", default="1", help="data-parallel ranks (default 1)")
    c.add_argument("--ranks-per-node", help="ranks per node (default: all in one node)")
    c.add_argument("--intra-node", default="600GB/s", help="bandwidth per rank inside a node (default 600GB/s)")
    c.add_argument("--inter-node", default="25gbit", help="bandwidth per node between nodes (default 25gbit)")
    c.add_argument("--intra-latency", default="2us")
    c.add_argument("--inter-latency", default="10us")
    c.add_argument("--hierarchy", default="auto", choices=("auto", "flat", "node_aware"),
                   help='the compressed collectives\' form across nodes (config "topology.hierarchy"): '
                        '"auto" (default, node-aware where the ranks span several nodes of more than one '
                        'rank), "flat", "node_aware" (docs/guides/multi-node.md)')
    c.add_argument("--node-reduce", default="fp32", choices=("fp32", "1bit"),
                   help='the node step of the 1-bit family\'s node-aware allreduce (config '
                        '"topology.node_reduce"): "fp32" (default, an fp32 reduce-scatter inside the node) or '
                        '"1bit" (the first half of a 1-bit allreduce over the node, on several nodes of more '
                        'than one rank); the rows of other algorithms are unchanged (docs/guides/multi-node.md)')
    c.add_argument("--shared-link", action="store_true",
                   help="every rank's traffic crosses one link of --inter-node bandwidth (bench/netem.sh)")
    c.add_argument("--cpu-oversubscription", type=float, default=1.0,
                   help="ranks' CPU threads per core of their machine: > 1 slows the profile's work (default 1)")
    c.add_argument("--measured-network", action="store_true",
                   help="the network measured by python -m dsopt.plan.measure_network, from the profile")
    s = p.add_argument_group("step and run")
    s.add_argument("--compute", default="0", help="forward+backward time per step (0.35, 350ms; default 0)")
    s.add_argument("--backward-fraction", type=float, default=2 / 3,
                   help="share of the compute that is backward, behind which overlap hides reductions")
    s.add_argument("--steps", default="100000", help="updates in the run (1-bit averages; default 100000)")
    s.add_argument("--freeze-step", help="1-bit Adam/LAMB freeze_step (default 15%% of --steps)")
    s.add_argument("--var-freeze-step", help="0/1 Adam var_freeze_step (default 15%% of --steps)")
    s.add_argument("--local-step-scaler", default="32678")
    s.add_argument("--local-step-clipper", default="16")
    s.add_argument("--reduce-bucket-size", default="5e8")
    s.add_argument("--allgather-bucket-size", default="5e8")
    s.add_argument("--algorithms", help="comma-separated optimizer types the library registers (AdamW, Lion, Lamb, "
                   "SGD, OneBitAdam, ...; any case) or 'all': every configuration of each (every gradient path "
                   "it runs on, each codec pair, +overlap), and the choice among them (default: AdamW's, the "
                   "other algorithms on the replicated path and ZeRO-1/2, the 1-bit family; the choice among "
                   "AdamW's and the 1-bit family's)")
    s.add_argument("--configs", help="comma-separated configuration names (default: all of --algorithms)")
    s.add_argument("--fsdp2", action="store_true",
                   help="add FSDP2's rows (FSDP2 with its own collectives and each codec pair of dsopt.torch.fsdp; "
                        "HSDP by dsopt: FSDP2 in each node, AdamW or the 1-bit family across the nodes), a "
                        "column of the caller's parameters and gradients per rank, and count those in "
                        "--memory-limit")
    s.add_argument("--memory-limit", help="bytes of dsopt memory per rank the choice must fit (e.g. 8GiB; with "
                   "--fsdp2 the caller's parameters and gradients too)")
    o = p.add_argument_group("profile and output")
    o.add_argument("--profile", help="profile JSON (default ~/.cache/dsopt/plan-profile.json)")
    o.add_argument("--calibrate", action="store_true", help="time this machine's kernels and save the profile")
    o.add_argument("--calibrate-numel", default="2097152", help="model elements timed by --calibrate")
    o.add_argument("--calibrate-device", default="cpu", choices=("cpu", "cuda"),
                   help="--calibrate: time the CPU kernels, or the CUDA ones on the current GPU "
                        "(a CUDA build of libdsopt and torch with CUDA)")
    o.add_argument("--concurrent", type=int, default=1,
                   help="--calibrate: run N calibrations at once and average them, so that the costs are "
                        "those of a machine whose cores are all busy (give the cores your ranks share; default 1)")
    o.add_argument("--threads", type=int, default=0,
                   help="--calibrate: CPU threads per optimizer (default 0: a rank alone's default share)")
    o.add_argument("--plot", help="write the table as a PNG plot to this path")
    return p


def _memory_limit(text):
    if text is None:
        return None
    units = {"kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40, "kb": 1e3, "mb": 1e6,
             "gb": 1e9, "tb": 1e12, "b": 1, "": 1}
    m = re.fullmatch(r"([0-9.eE+]+)\s*([A-Za-z]*)", text.strip())
    if not m or m.group(2).lower() not in units:
        raise ValueError(f"memory limit: cannot read {text!r} (examples: 8GiB, 512MiB)")
    return float(m.group(1)) * units[m.group(2).lower()]


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"python -m dsopt.plan: {exc}", file=sys.stderr)
        return 2


def run(args):
    if args.calibrate:
        from .calibrate import calibrate_concurrent
        if args.threads < 0:
            raise ValueError(f"threads must be >= 0, got {args.threads}")
        prof = calibrate_concurrent(args.concurrent, parse_count(args.calibrate_numel, "calibration elements"),
                                    threads=args.threads, log=print, device=args.calibrate_device)
        print(f"saved {save_profile(prof, args.profile)}")
        if not (args.params or args.sizes):
            return 0
    if not (args.params or args.sizes):
        raise ValueError("give the model: --params COUNT or --sizes N1,N2,...")
    model = (Model.from_sizes([parse_count(x, "tensor size") for x in args.sizes.split(",")], args.dtype)
             if args.sizes else Model.from_params(args.params, args.dtype, args.tensors))
    prof = load_profile(args.profile)
    if args.measured_network:
        if not prof.network:
            raise ValueError("the profile holds no measured network: run "
                             "mpirun -np P python -m dsopt.plan.measure_network first")
        cluster = Cluster.from_measurement(prof.network, parse_count(args.ranks, "ranks")
                                           if args.ranks != "1" else None)
    else:
        cluster = Cluster.parse(args.ranks, args.ranks_per_node, args.intra_node, args.inter_node,
                                args.intra_latency, args.inter_latency, "shared" if args.shared_link else "nodes",
                                args.cpu_oversubscription, args.hierarchy, args.node_reduce)
    steps = parse_count(args.steps, "steps")
    freeze = parse_count(args.freeze_step, "freeze step") if args.freeze_step else max(2, steps * 15 // 100)
    var_freeze = parse_count(args.var_freeze_step, "var freeze step") if args.var_freeze_step else max(1, steps * 15 // 100)
    settings = Settings(reduce_bucket_size=parse_count(args.reduce_bucket_size, "reduce bucket size"),
                        allgather_bucket_size=parse_count(args.allgather_bucket_size, "allgather bucket size"),
                        steps=steps, freeze_step=freeze, var_freeze_step=var_freeze,
                        local_step_scaler=parse_count(args.local_step_scaler, "local step scaler"),
                        local_step_clipper=parse_count(args.local_step_clipper, "local step clipper"))
    compute = parse_time(args.compute, "compute time")
    algorithms = None
    if args.algorithms:
        algorithms = (list(algorithm_names()) if args.algorithms.strip().lower() == "all"
                      else [a.strip() for a in args.algorithms.split(",") if a.strip()])
    shown = all_configs(algorithms=algorithms)
    pool = shown if algorithms else None
    if args.fsdp2:
        extra = fsdp_configs(algorithms)
        shown = shown + extra
        pool = (pool or all_configs(algorithms=algorithm_names())) + extra
    configs = ([by_name(n.strip(), pool) for n in args.configs.split(",")]
               if args.configs else shown)
    records = plan(model, cluster, compute, prof, settings, configs, args.backward_fraction)
    print(f"model: {model.numel:,} parameters ({model.dtype}) in {model.tensors} tensor(s)")
    print(f"cluster: {cluster.describe()}")
    print(f"compute: {compute * 1e3:.1f} ms per step; run: {steps:,} updates, freeze_step {freeze:,}, "
          f"var_freeze_step {var_freeze:,}")
    if compute == 0:
        print("         (no --compute given: the times and speedups are of the optimizer's part of a step alone)")
    print(f"profile: {prof.label}")
    print()
    print(table(records, model if args.fsdp2 else None))
    print()
    print(NOTES)
    if args.fsdp2:
        print(CALLER_NOTE)
    # The choice: among the rows --configs names, else those of --algorithms.
    among = [c.algorithm for c in configs] if args.configs else algorithms
    best, why = choose(records, _memory_limit(args.memory_limit), algorithms=among,
                       caller_of=model if args.fsdp2 else None)
    print()
    print(f"choice: {best.name}: {why}")
    if args.plot:
        plot(records, args.plot, f"{model.numel:,} parameters, {cluster.describe()}")
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
