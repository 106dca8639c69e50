"""Runs of the GPT of examples/python/gpt.py that blow up while staying
finite (the loss climbs back up, no gradient is ever Inf or NaN, so no
step is skipped), next to healthy runs of the same model: per step the
global gradient norm (StepInfo.grad_norm), rank 0's batch loss, the
learning rate and the step's phase, and the validation loss every 5 steps.
One JSON file per case in the output folder (default
/tmp/divergence_cases), for detectors of finite divergence.

    python3 docs/design/transformer_blowups.py [--out DIR] [--ranks 4] [--steps 300]
        [--only NAME,NAME]

Each case is transformer_runs' user settings (tiny GPT on the license
texts, 4 ranks, warmup then cosine) with the changes its name says.
"""
import argparse
import json
import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import transformer_runs  # noqa: E402
from transformer_runs import TransformerRun  # noqa: E402

# name -> (class, options over the user settings, what it shows)
CASES = {
    "adamw": ("AdamW", {}, "healthy: the baseline"),
    "onebit_adam": ("OneBitAdam", {}, "healthy: 1-bit Adam with the user settings"),
    "onebit_lamb": ("OneBitLamb", {}, "healthy: 1-bit LAMB with the user settings (lr 1e-2)"),
    "zero_one_adam": ("ZeroOneAdam", {}, "healthy: 0/1 Adam with the user settings"),
    "adamw_lr1e-2": ("AdamW", {"lr": 1e-2}, "AdamW at 10x the learning rate"),
    "onebit_lamb_lr4e-2": ("OneBitLamb", {"lr": 4e-2}, "1-bit LAMB at 4x its learning rate"),
    "lamb_lr4e-2": ("OneBitLamb", {"lr": 4e-2, "freeze_step": 100000},
                    "LAMB without compression at the same learning rate"),
    "onebit_adam_lr1e-2": ("OneBitAdam", {"lr": 1e-2}, "1-bit Adam at 10x the learning rate"),
    "onebit_adam_lr3e-2": ("OneBitAdam", {"lr": 3e-2}, "1-bit Adam at 30x the learning rate"),
    "onebit_adam_freeze2": ("OneBitAdam", {"freeze_step": 2}, "1-bit Adam frozen after one warmup update"),
    "onebit_adam_freeze2_lr3e-3": ("OneBitAdam", {"freeze_step": 2, "lr": 3e-3},
                                   "1-bit Adam frozen after one warmup update, 3x the learning rate"),
    "zero_one_adam_lr1e-2": ("ZeroOneAdam", {"lr": 1e-2}, "0/1 Adam at 10x the learning rate"),
    "adamw_lr1e-1": ("AdamW", {"lr": 1e-1}, "AdamW at 100x the learning rate"),
    "onebit_lamb_lr2e-1": ("OneBitLamb", {"lr": 2e-1}, "1-bit LAMB at 20x its learning rate"),
    "onebit_lamb_lr5e-1": ("OneBitLamb", {"lr": 5e-1}, "1-bit LAMB at 50x its learning rate"),
    "onebit_adam_lr1e-1": ("OneBitAdam", {"lr": 1e-1}, "1-bit Adam at 100x the learning rate"),
    "onebit_adam_deepspeed_rule": ("OneBitAdam", {"stabilize": False, "bias_correction": False},
                                   "1-bit Adam with DeepSpeed's rule (no clamp, no bias correction)"),
    "onebit_adam_deepspeed_rule_freeze2": ("OneBitAdam", {"stabilize": False, "bias_correction": False,
                                                          "freeze_step": 2},
                                           "DeepSpeed's rule frozen after one warmup update"),
    "onebit_adam_no_stabilize_lr1e-2": ("OneBitAdam", {"stabilize": False, "lr": 1e-2},
                                        "1-bit Adam without the clamp at 10x the learning rate"),
    "zero_one_adam_deepspeed_rule": ("ZeroOneAdam", {"stabilize": False, "bias_correction": False},
                                     "0/1 Adam with DeepSpeed's rule"),
    "lamb_lr2e-1": ("OneBitLamb", {"lr": 2e-1, "freeze_step": 100000},
                    "LAMB without compression at 20x 1-bit LAMB's learning rate"),
    "onebit_adam_deepspeed_rule_freeze10": ("OneBitAdam", {"stabilize": False, "bias_correction": False,
                                                           "freeze_step": 10},
                                            "DeepSpeed's rule frozen after 9 warmup updates"),
    "onebit_adam_lr3e-1": ("OneBitAdam", {"lr": 3e-1}, "1-bit Adam at 300x the learning rate"),
    "zero_one_adam_lr1e-1": ("ZeroOneAdam", {"lr": 1e-1}, "0/1 Adam at 100x the learning rate"),
}
EVAL_EVERY = 5


def library_commit():
    """The repository's last commit, and the libdsopt this process loaded
    (the ranks load the same one: LD_LIBRARY_PATH, else the extension's
    rpath)."""
    repo = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%h %s"], capture_output=True,
                            text=True).stdout.strip()
    loaded = sorted({line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
                     if "libdsopt" in line})
    return f"{commit} (library: {', '.join(loaded)})"


def case_record(name, run, ranks, results):
    """The JSON of one case: its settings, per-step series (rank 0) and summary."""
    r0 = results[0]
    validation = [v for _, v in r0.validation]
    finite = [v for v in validation if math.isfinite(v)]
    best = min(finite) if finite else float("nan")
    return {
        "case": name,
        "what": CASES[name][2],
        "library": library_commit(),
        "ranks": ranks,
        "run": asdict(run),
        "optimizer_kwargs": transformer_runs.optimizer_kwargs(run),
        "steps_run": len(r0.losses),
        "grad_norm": r0.info["grad_norm"],
        "train_loss": r0.losses,
        "lr": r0.lr,
        "phase": r0.info["phase"],
        "compressed": r0.info["compressed"],
        "skipped": r0.info["skipped"],
        "validation": r0.validation,
        "final_validation": r0.final_validation,
        "final_validation_per_rank": [r.final_validation for r in results],
        "best_validation": best,
        "final_over_best": r0.final_validation / best if finite else float("nan"),
        "error": r0.error,
        "error_step": r0.error_step,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/divergence_cases")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    names = args.only.split(",") if args.only else list(CASES)
    runs = {n: TransformerRun(n, CASES[n][0], steps=args.steps, eval_every=EVAL_EVERY, options=CASES[n][1],
                              report_grad_norm=True) for n in names}
    results = transformer_runs.run_under_mpirun(list(runs.values()), args.ranks, timeout=120 * len(runs) + 120)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("| case | final validation | best validation | final / best | max grad norm | skipped | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, run in runs.items():
        record = case_record(name, run, args.ranks, results[name])
        (out / f"{name}.json").write_text(json.dumps(record))
        norms = [g for g in record["grad_norm"] if g >= 0]
        print(f"| {name} | {record['final_validation']:.4f} | {record['best_validation']:.4f} | "
              f"{record['final_over_best']:.3f} | {max(norms) if norms else float('nan'):.3g} | "
              f"{sum(record['skipped'])} | {record['error'][:60]} |")


if __name__ == "__main__":
    main()
