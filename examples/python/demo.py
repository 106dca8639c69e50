"""dsopt's main demo: data-parallel training of a digits MLP with AdamW,
AdamW under ZeRO stage 2, 1-bit Adam, 1-bit LAMB and 0/1 Adam on every rank
of MPI_COMM_WORLD (or one process).

The model and data come from small_models.py: a ReLU MLP 64-128-128-10
(26,122 parameters, plain numpy forward and backward) on scikit-learn's
bundled 8x8 digits (80/20 split). Every run uses lr 1e-3, weight_decay 0.01
and a global batch of 64 split evenly over the ranks; each rank passes the
mean gradient of its share; dsopt averages the gradients (AdamW, 1-bit
Adam's warmup) or exchanges the momentum 1-bit compressed (1-bit Adam from
freeze_step = 15% of the steps on) and updates the parameters in place. Eight runs:

- AdamW;
- AdamW with "zero_optimization": {"stage": 2}: each rank keeps the moments
  of its 1/N shard only; gradients are reduce-scattered and the parameters
  allgathered, in buckets of 8,192 elements. It follows the AdamW run (bit
  for bit on one or two ranks, within fp32 rounding on more, where MPI sums
  in another order) with less optimizer memory per rank from two ranks on
  (on one rank it holds more: the fp32 gradient copy);
- the same ZeRO-2 run with "gradient_accumulation_steps": 2: each rank
  splits its share of the batch into two micro-batches and hands every
  tensor's gradient over with grad_ready as it would come out of backward
  (last tensor first); buckets are reduce-scattered while the rest is
  computed, on dsopt's thread, and step() completes the step with the mean,
  the gradient of the whole share: it follows the ZeRO-2 run within fp32
  rounding;
- the ZeRO-2 run with compressed traffic ("compression": {"gradients":
  "int4", "parameters": "int8"}): each rank sends its gradient pieces as
  4-bit codes with a scale per 256 elements, with error feedback, and the
  owners send the updated parameters as 8-bit codes
  (docs/guides/compressed-zero.md); on one rank nothing travels and it is
  the ZeRO-2 run;
- 1-bit Adam with dsopt's defaults ("stabilize": true);
- 1-bit Adam with "stabilize" and "bias_correction" false, DeepSpeed's rule, to show what the
  default avoids. On 4 ranks it blows up a few steps after freeze_step: the
  parameters overflow, every later step is skipped for non-finite gradients,
  and after max_consecutive_skips (50) in a row step() raises
  dsopt.NonFiniteError; the demo reports "diverged at step N: ..." and goes
  on. On one process it blows up too (the loss spikes and goes
  non-finite, without skipped steps) and ends at chance level;
- 1-bit LAMB with dsopt's defaults, freeze_step = 15% of the steps and lr
  1e-2 (the trust ratio scales every tensor's step);
- 0/1 Adam with dsopt's defaults and var_freeze_step = 15% of the steps
  (variance updates at growing intervals, 1-bit gradient steps between
  them, then local steps with 1-bit syncs every 1, 2, 4, ... 16 steps).

Rank 0 prints the loss (mean over the ranks), the stage and the bytes on the
wire (all ranks) every --log-every steps, then a summary table (with the
memory dsopt holds for the optimizer on each rank), and writes
OUT/demo.png (loss per step, log scale, and cumulative bytes) and
OUT/summary.json.

    mpirun -np 4 python3 demo.py --out out/demo
    python3 demo.py --steps 150          # one process
"""
import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
sys.path.insert(0, HERE)
import dsopt  # noqa: E402
from small_models import MLP, load_digits_split  # noqa: E402
from training_runs import train  # noqa: E402

try:
    from mpi4py import MPI
except ImportError:  # one process with the local communicator
    MPI = None

NonFiniteError = getattr(dsopt, "NonFiniteError", dsopt.DsoptError)
LR, WEIGHT_DECAY = 1e-3, 0.01
LAMB_LR = 1e-2  # LAMB's trust ratio scales each tensor's step: it takes a larger lr
# ZeRO's buckets, in elements: a fraction of this small model, as DeepSpeed's
# default 5e8 is of a model with billions of parameters.
ZERO_BUCKET = 8192


def runs(steps):
    """(name, dsopt config) of each run, in order."""
    freeze = max(2, int(0.15 * steps))
    onebit = {"lr": LR, "weight_decay": WEIGHT_DECAY, "freeze_step": freeze}
    return [
        ("AdamW", {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}}}),
        ("AdamW, ZeRO-2", {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
                           "zero_optimization": {"stage": 2, "reduce_bucket_size": ZERO_BUCKET,
                                                 "allgather_bucket_size": ZERO_BUCKET}}),
        ("AdamW, ZeRO-2, G=2 handed over",
         {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
          "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": 2, "reduce_bucket_size": ZERO_BUCKET,
                                "allgather_bucket_size": ZERO_BUCKET}}),
        ("AdamW, ZeRO-2, int4/int8 codes",
         {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WEIGHT_DECAY}},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": ZERO_BUCKET,
                                "allgather_bucket_size": ZERO_BUCKET,
                                "compression": {"gradients": "int4", "parameters": "int8"}}}),
        ("1-bit Adam", {"optimizer": {"type": "OneBitAdam", "params": dict(onebit)}}),
        ("1-bit Adam, DeepSpeed's rule",
         {"optimizer": {"type": "OneBitAdam", "params": dict(onebit, stabilize=False, bias_correction=False)}}),
        ("1-bit LAMB", {"optimizer": {"type": "OneBitLamb", "params": dict(onebit, lr=LAMB_LR)}}),
        ("0/1 Adam", {"optimizer": {"type": "ZeroOneAdam", "params": {
            "lr": LR, "weight_decay": WEIGHT_DECAY, "var_freeze_step": freeze, "local_step_scaler": 10}}}),
    ]


def run_one(name, config, model, data, comm, mpi, world, rank, steps, batch, log_every):
    """Trains one model; returns the row of the summary and the per-step
    history (loss averaged over the ranks, bytes summed over the ranks)."""
    history = {"loss": [], "bytes": [], "compressed": [], "skipped": []}

    def on_step(step, loss, info):
        sent = int(info.bytes_sent)
        if mpi is not None:  # collective: every rank calls on_step at every step
            loss = mpi.allreduce(loss) / world
            sent = mpi.allreduce(sent)
        history["loss"].append(float(loss))
        history["bytes"].append(sent)
        history["compressed"].append(bool(info.compressed))
        history["skipped"].append(bool(info.skipped))
        n = step + 1
        first_skip = info.skipped and sum(history["skipped"]) == 1
        if rank == 0 and (n % log_every == 0 or n == 1 or n == steps or first_skip):
            stage = {dsopt.PHASE_SKIPPED: "skipped", dsopt.PHASE_FULL: "full fp32",
                     dsopt.PHASE_COMPRESSED: "compressed", dsopt.PHASE_LOCAL: "local",
                     dsopt.PHASE_SYNC: "1-bit sync"}[info.phase]
            note = "  <- first step skipped: non-finite gradient" if first_skip else ""
            print(f"  [{name}] step {n:4d}/{steps}  loss {loss:8.4f}  {stage:10s}  "
                  f"bytes on the wire {sent:>9,d}{note}", flush=True)

    start = time.perf_counter()
    error = ""
    # A diverging run overflows in numpy and has its steps skipped; the demo
    # reports both itself instead of a warning per rank and step.
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
        try:
            result = train(model, data, config, comm, rank, world, steps=steps, batch=batch, on_step=on_step)
            error = result.error
        except NonFiniteError as e:  # in case train() lets it through
            result, error = None, str(e)
    elapsed = time.perf_counter() - start
    done = len(history["loss"])
    skipped = sum(history["skipped"])
    diverged_at = None
    if error:
        diverged_at = done + 1  # the step that raised (skipped too; not in history)
        skipped += 1
        if rank == 0:
            print(f"  [{name}] diverged at step {diverged_at}: {error.splitlines()[0]}", flush=True)
    if mpi is not None:
        elapsed = mpi.allreduce(elapsed, op=MPI.MAX)
    row = {
        "name": name,
        "config": config,
        "steps_run": done,
        "initial_loss": history["loss"][0] if history["loss"] else float("nan"),
        "final_loss": result.train_loss if result is not None else float("nan"),
        "test_accuracy": result.test_accuracy if result is not None else 0.0,
        "skipped_steps": skipped,
        "diverged_at": diverged_at,
        "error": error.splitlines()[0] if error else "",
        "total_bytes": int(sum(history["bytes"])),
        "memory_per_rank": int(result.memory_bytes) if result is not None else 0,
        "seconds": elapsed,
    }
    first = history["compressed"].index(True) + 1 if any(history["compressed"]) else None
    row["first_compressed_step"] = first
    if first is not None and rank == 0:
        warm, comp = history["bytes"][first - 2], history["bytes"][first - 1]
        row["bytes_per_step"] = {"warmup": warm, "compressed": comp}
    return row, history


def _finite(obj):
    """NaN and infinities become null, so summary.json is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def plot(rows, histories, path, world):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = ["tab:blue", "tab:cyan", "tab:green", "tab:red", "tab:purple", "tab:orange"]
    fig, (ax_loss, ax_bytes) = plt.subplots(1, 2, figsize=(12, 4.8))
    freeze = None
    for row, hist, color in zip(rows, histories, colors):
        # dashed: DeepSpeed's rule coincides with 1-bit Adam during warmup
        style = (0, (3, 2)) if "DeepSpeed's rule" in row["name"] else "-"
        if "ZeRO" in row["name"]:  # on top of AdamW's curve
            style = (0, (1, 2))
        loss = np.array(hist["loss"], dtype=float)
        steps = np.arange(1, len(loss) + 1)
        finite = np.isfinite(loss)
        label = row["name"]
        if row["diverged_at"]:
            label += f" (stopped: diverged at step {row['diverged_at']})"
        elif row["skipped_steps"]:
            label += f" ({row['skipped_steps']} steps skipped)"
        elif not finite.all():
            label += " (loss not finite at times)"
        ax_loss.plot(steps, np.where(finite, loss, np.nan), color=color, ls=style, lw=1.2, label=label)
        if not finite.all():  # where the loss first went non-finite
            first_bad = int(np.argmin(finite)) + 1
            last = loss[first_bad - 2] if first_bad > 1 and finite[first_bad - 2] else 1.0
            ax_loss.plot([first_bad], [last], marker="X", color=color, ms=9, ls="none")
            ax_loss.annotate(f"loss NaN/inf from step {first_bad}", (first_bad, last), color=color,
                             textcoords="offset points", xytext=(10, 14 if last < 1 else -20), fontsize=8,
                             bbox={"boxstyle": "round", "fc": "white", "ec": color, "alpha": 0.9})
        if row["diverged_at"]:
            skip_from = hist["skipped"].index(True) + 1 if any(hist["skipped"]) else row["diverged_at"]
            for ax in (ax_loss, ax_bytes):
                ax.axvspan(skip_from, row["diverged_at"], color=color, alpha=0.08, lw=0)
                ax.axvline(row["diverged_at"], color=color, ls="--", lw=1)
        if hist["bytes"]:
            ax_bytes.plot(steps, np.cumsum(hist["bytes"]) / 1e6, color=color, ls=style, lw=1.5,
                          label=label)
        if row["first_compressed_step"] and freeze is None:  # 1-bit Adam's freeze_step
            freeze = row["first_compressed_step"]
    if freeze:
        for ax in (ax_loss, ax_bytes):
            ax.axvline(freeze, color="gray", ls=":", lw=1)
    ax_loss.set_yscale("log")
    ax_loss.set(xlabel="step", ylabel="training loss (batch, mean over ranks)",
                title="Loss per step (dotted: freeze_step, compression starts;\n"
                      "shaded: steps skipped, NaN gradients; dashed: run stopped)")
    ax_bytes.set(xlabel="step", ylabel="MB sent, all ranks",
                 title=f"Cumulative bytes on the wire ({world} rank{'s' if world > 1 else ''})")
    if not any(r["total_bytes"] > 0 for r in rows):
        ax_bytes.set_title("Cumulative bytes on the wire (one process: none)")
    fig.legend(*ax_loss.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=9, frameon=False)
    for ax in (ax_loss, ax_bytes):
        ax.grid(alpha=0.3, which="both")
        ax.title.set_fontsize(9)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64, help="global batch (all ranks)")
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--out", default="out/demo")
    args = ap.parse_args()

    mpi = MPI.COMM_WORLD if (MPI is not None and MPI.COMM_WORLD.size > 1) else None
    if mpi is not None:
        world, rank = mpi.size, mpi.rank
        comm = dsopt.Communicator.from_mpi4py(mpi)
    else:
        world, rank = 1, 0
        comm = dsopt.Communicator.local()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} must be a multiple of the {world} ranks")
    model, data = MLP(), load_digits_split()
    plan = runs(args.steps)
    onebit_params = next(c for n, c in plan if n == "1-bit Adam")["optimizer"]["params"]
    if rank == 0:
        print(f"dsopt demo: digits MLP {'-'.join(map(str, model.sizes))} ({model.num_params():,} parameters), "
              f"{len(data.y_train)} train / {len(data.y_test)} test images, {world} rank(s), "
              f"global batch {args.batch}, {args.steps} steps, lr {LR:g}, weight_decay {WEIGHT_DECAY:g}, "
              f"1-bit Adam freeze_step {onebit_params['freeze_step']}", flush=True)

    rows, histories = [], []
    for name, config in plan:
        if rank == 0:
            print(f"\n== {name} ==", flush=True)
        row, hist = run_one(name, config, model, data, comm, mpi, world, rank, args.steps, args.batch,
                            args.log_every)
        rows.append(row)
        histories.append(hist)
    if rank != 0:
        return

    header = "{:<32} {:>10} {:>9} {:>8} {:>18} {:>13} {:>7}".format(
        "optimizer", "train loss", "test acc", "skipped", "bytes on the wire", "memory/rank", "time")
    print("\n" + header)
    for r in rows:
        loss = f"{r['final_loss']:.4f}" if math.isfinite(r["final_loss"]) else "nan"
        print("{:<32} {:>10} {:>9.3f} {:>8d} {:>18,d} {:>13,d} {:>6.1f}s".format(
            r["name"], loss, r["test_accuracy"], r["skipped_steps"], r["total_bytes"],
            r["memory_per_rank"], r["seconds"]))
    for r in rows:
        if r["diverged_at"]:
            print(f"{r['name']}: diverged at step {r['diverged_at']} (dsopt.NonFiniteError, message above)")
    by_name = {r["name"]: r for r in rows}
    adamw, zero2, onebit = by_name["AdamW"], by_name["AdamW, ZeRO-2"], by_name["1-bit Adam"]
    print(f"\nAdamW, ZeRO-2: dsopt holds {zero2['memory_per_rank']:,} bytes per rank for the optimizer, "
          f"{adamw['memory_per_rank'] / zero2['memory_per_rank']:.1f}x less than AdamW's "
          f"{adamw['memory_per_rank']:,} on {world} rank(s) (moments and gradient shard of 1/{world} "
          f"of the parameters, plus buffers); train loss {zero2['final_loss']:.4f} vs {adamw['final_loss']:.4f}.")
    packed = by_name["AdamW, ZeRO-2, int4/int8 codes"]
    if world > 1 and packed["total_bytes"]:
        print(f"\nAdamW, ZeRO-2, int4/int8 codes: {zero2['total_bytes'] / packed['total_bytes']:.1f}x fewer bytes "
              f"than ZeRO-2, {packed['memory_per_rank']:,} bytes per rank (the residual of error feedback "
              f"included); train loss {packed['final_loss']:.4f} vs {zero2['final_loss']:.4f}.")
    if world > 1 and onebit["total_bytes"]:
        per = onebit.get("bytes_per_step", {})
        if per.get("compressed"):
            print(f"\n1-bit Adam: a warmup step sends {per['warmup']:,} bytes (all ranks), a compressed one "
                  f"{per['compressed']:,} ({per['warmup'] / per['compressed']:.1f}x fewer); over the run, "
                  f"warmup included, {adamw['total_bytes'] / onebit['total_bytes']:.1f}x fewer bytes than AdamW.")
    os.makedirs(args.out, exist_ok=True)
    plot_path = os.path.join(args.out, "demo.png")
    plot(rows, histories, plot_path, world)
    summary = {"world": world, "steps": args.steps, "batch": args.batch, "model": list(model.sizes),
               "num_params": model.num_params(), "results": rows}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(_finite(summary), f, indent=2)
    print(f"plot: {plot_path}\nsummary: {os.path.join(args.out, 'summary.json')}")


if __name__ == "__main__":
    main()
