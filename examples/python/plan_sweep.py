"""Where each dsopt configuration wins, past this machine: the planner
(dsopt.plan; FSDP2's configurations in the pool) over model sizes from 125M to 70B parameters, 8 to 1,024
GPUs (8 per node) and 10 to 400 Gbit/s per node between nodes.

Inputs (stated, not measured): bf16 parameters in tensors of at most 2^24
elements, compute per step of 4,096 tokens per GPU at 40% of an A100's
312 TFLOP/s (6 x params x tokens / 125e12 s), 600 GB/s inside a node, a run of 100,000 steps with freeze_step
and var_freeze_step at 15%, 80 GB per GPU of which the caller's parameters
and gradients (4 bytes per parameter; under FSDP2 their shards and the
largest module's unsharded ones) and dsopt's memory must fit, and the
update and coding costs of the profile (default: the saved one, else the
uncalibrated defaults). Prints a markdown table: the fastest configuration
and its speedup over AdamW in each cell ("AdamW" needs no other; "-": no
configuration fits).

    python examples/python/plan_sweep.py [--profile PATH] [--exact]

--exact keeps to configurations with AdamW's numerics (AdamW, ZeRO-1/2,
with or without overlap)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bindings", "python"))

from dsopt.plan import Cluster, Model, Settings, choose, load_profile, plan  # noqa: E402
from dsopt.plan.planner import caller_memory  # noqa: E402
from dsopt.plan.configs import all_configs, fsdp_configs  # noqa: E402

MODELS = [("125M", 125e6), ("1.3B", 1.3e9), ("7B", 7e9), ("13B", 13e9), ("70B", 70e9)]
GPUS = [8, 64, 256, 1024]
BANDWIDTHS = ["10gbit", "25gbit", "100gbit", "400gbit"]
GPU_MEMORY = 80e9
TOKENS, FLOPS = 4096, 0.4 * 312e12


def cell(params, gpus, inter, profile, exact):
    model = Model.from_params(params, "bf16")
    cluster = Cluster.parse(gpus, 8, intra="600GB/s", inter=inter)
    compute = 6 * params * TOKENS / FLOPS
    settings = Settings(steps=100_000, freeze_step=15_000, var_freeze_step=15_000)
    records = plan(model, cluster, compute, profile, settings, all_configs() + fsdp_configs())
    # The caller's parameters and gradients: the whole model's (4 bytes per
    # parameter in bf16) on every rank, or FSDP2's shards and largest module.
    fits = [r for r in records if r.memory.total + caller_memory(r, model) <= GPU_MEMORY]
    try:
        best, _ = choose(fits, None, exact_numerics=exact)
    except ValueError:
        return "-"
    return f"{best.name} {best.speedup:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile")
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args()
    profile = load_profile(args.profile)
    print(f"profile: {profile.label}")
    print()
    print("| model | GPUs | " + " | ".join(f"{b.replace('gbit', ' Gbit/s')}" for b in BANDWIDTHS) + " |")
    print("| --- | ---: | " + " | ".join("---" for _ in BANDWIDTHS) + " |")
    for name, params in MODELS:
        for gpus in GPUS:
            cells = [cell(params, gpus, b, profile, args.exact) for b in BANDWIDTHS]
            print(f"| {name} | {gpus} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
