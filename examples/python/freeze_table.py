"""Measures the freeze_step guidance of docs/optimizers/onebit-adam.md on the digits MLP of
small_models.py: 1-bit Adam with freeze_step and 0/1 Adam with
var_freeze_step at 5%, 15% and 50% of the run,
with dsopt's rule (the defaults: stabilized, bias-corrected) and with
DeepSpeed's ("stabilize" and "bias_correction" false), on 1 rank and on 4,
against the uncompressed rules: 1-bit Adam's warmup rule (freeze_step after
the run: AdamW up to rounding) and AdamW.
User settings: 300 steps, global batch 64, lr 1e-3, weight_decay 0.01,
default betas; every row over 3 seeds. Prints a Markdown table.

    python3 examples/python/freeze_table.py [--steps 300] [--seeds 0 1 2]

The 4-rank rows run in one ``mpirun -np 4`` of this script (started by it;
skipped, said so, without mpirun or mpi4py); the 1-rank rows in this
process. PYTHONPATH must reach the dsopt package (bindings/python).
"""
import argparse
import os
import sys
import time

# Read by libgomp when libdsopt loads: the ranks share the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import small_models  # noqa: E402
import training_runs  # noqa: E402
from training_runs import RunSpec, adamw_config, onebit_config, zoadam_config  # noqa: E402

FREEZE_FRACTIONS = (0.05, 0.15, 0.50)
MPI_WORLD = 4


def rows_for(steps):
    """[(row label, freeze_step or None, dsopt's rule (True) / DeepSpeed's (False) / None, config)]"""
    rows = [("AdamW", None, None, adamw_config()),
            ("1-bit Adam, no freeze (its warmup rule)", None, None, onebit_config(freeze_step=100000))]
    for fraction in FREEZE_FRACTIONS:
        freeze_step = max(1, round(fraction * steps))
        for stabilize in (True, False):
            rows.append((f"1-bit Adam, freeze at {fraction:.0%}", freeze_step, stabilize,
                         onebit_config(freeze_step=freeze_step, stabilize=stabilize, bias_correction=stabilize)))
    # 0/1 Adam: the freeze_step column is its var_freeze_step (schedules of
    # training_runs.zoadam_config: var_update_scaler 16, local_step_scaler 10,
    # local_step_clipper 16).
    for fraction in FREEZE_FRACTIONS:
        var_freeze_step = max(1, round(fraction * steps))
        for stabilize in (True, False):
            rows.append((f"0/1 Adam, var_freeze_step at {fraction:.0%}", var_freeze_step, stabilize,
                         zoadam_config(var_freeze_step, stabilize=stabilize, bias_correction=stabilize)))
    return rows


def spec_name(row_index, seed):
    return f"row{row_index}/seed{seed}"


def outcome(result):
    """Skipped steps, or where NonFiniteError ended the run."""
    return f"error at step {result.error_step}" if result.error else str(result.skipped)


def table_line(cells):
    return "| " + " | ".join(cells) + " |"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()

    rows = rows_for(args.steps)
    specs = [RunSpec(spec_name(i, seed), "digits", config, steps=args.steps, batch=args.batch, seed=seed)
             for i, (_, _, _, config) in enumerate(rows) for seed in args.seeds]
    started = time.time()
    by_world = {1: {name: [result] for name, result in training_runs.run_local(specs).items()}}
    missing = training_runs.mpi_available()
    if missing:
        print(f"4-rank rows left out: {missing}", file=sys.stderr)
    else:
        by_world[MPI_WORLD] = training_runs.run_under_mpirun([__file__, "--mpi-worker"], specs, MPI_WORLD,
                                                            timeout=600)
    elapsed = time.time() - started

    model = small_models.MLP()
    print(f"digits MLP {'-'.join(map(str, model.sizes))} ({model.num_params():,} parameters), {args.steps} steps, "
          f"global batch {args.batch}, lr 1e-3, weight_decay 0.01, seeds {args.seeds}; "
          f"{os.cpu_count()} cores, {elapsed:.0f} s\n")
    print(table_line(["ranks", "optimizer", "freeze_step", "rule", "final train loss: median (min-max)",
                      "test accuracy (median of finite runs)", "skipped steps per seed", "bytes on the wire (all ranks, median)"]))
    print(table_line(["---:", "---", "---:", "---", "---:", "---:", "---", "---:"]))
    for world, results in by_world.items():
        for i, (label, freeze_step, stabilize, _) in enumerate(rows):
            # every rank has the same parameters; rank 0 evaluated them
            per_seed = [results[spec_name(i, seed)] for seed in args.seeds]
            losses = [ranks[0].train_loss for ranks in per_seed]
            loss = f"{np.median(losses):.4f} ({min(losses):.4f}-{max(losses):.4f})" \
                if np.all(np.isfinite(losses)) else ", ".join(f"{x:.4f}" for x in losses)
            # NaN parameters predict class 0: no accuracy to speak of
            accuracies = [ranks[0].test_accuracy for ranks in per_seed if np.isfinite(ranks[0].train_loss)]
            accuracy = f"{np.median(accuracies):.3f}" if accuracies else "-"
            sent = np.median([sum(r.bytes_sent for r in ranks) for ranks in per_seed])
            print(table_line([str(world), label, "" if freeze_step is None else str(freeze_step),
                              "" if stabilize is None else ("dsopt" if stabilize else "DeepSpeed"), loss,
                              accuracy, ", ".join(outcome(ranks[0]) for ranks in per_seed),
                              f"{sent:,.0f}"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--mpi-worker"]:
        training_runs.mpi_worker_main(*sys.argv[2:])
    else:
        main()
