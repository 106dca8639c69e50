#!/usr/bin/env python3
"""Median (min-max) over several runs of bench/time_to_quality.py, as a
Markdown table: one row per optimizer.

    python3 bench/time_to_quality_summary.py RUN1/time_to_quality.json RUN2/time_to_quality.json ...

The runs must share their setup (model, steps, batch, ranks, network).
"""
import json
import statistics
import sys
from pathlib import Path

SAME_SETUP = ("ranks", "parameters", "config", "steps", "cap", "batch", "eval_every", "eval_windows", "corpus",
              "seed", "network")


def spread(values, digits):
    """'median (min-max)' of the values, or '-' when there are none."""
    if not values:
        return "-"
    low, mid, high = min(values), statistics.median(values), max(values)
    if low == high:
        return f"{mid:.{digits}f}"
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def summary(results):
    first = results[0]["setup"]
    for result in results[1:]:
        differing = [key for key in SAME_SETUP if result["setup"].get(key) != first.get(key)]
        if differing:
            raise SystemExit(f"time_to_quality_summary: the runs differ in {differing}")
    names = [r["optimizer"] for r in results[0]["runs"]]
    lines = [f"{len(results)} runs; GPT {first['config']}, {first['parameters']:,} parameters, {first['ranks']} ranks, "
             f"batch {first['batch']}, AdamW {first['steps']} steps; AdamW's validation loss after them: "
             f"{spread([r['target_loss'] for r in results], 4)}",
             "",
             "| optimizer | reached AdamW's loss | steps to it | s to it | AdamW s / s | "
             f"val loss after {first['steps']} steps | bytes sent per rank to it | skipped steps |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        rows = [next(r for r in result["runs"] if r["optimizer"] == name) for result in results]
        bases = [result["runs"][0]["seconds_to_target"] for result in results]
        hit = [(row, base) for row, base in zip(rows, bases) if row["reached"]]
        lines.append(" | ".join([
            f"| {name}", f"{len(hit)} of {len(rows)}",
            spread([row["steps_to_target"] for row, _ in hit], 0),
            spread([row["seconds_to_target"] for row, _ in hit], 1),
            spread([base / row["seconds_to_target"] for row, base in hit], 2) + ("x" if hit else ""),
            spread([row["loss_at_n"] for row in rows if row["loss_at_n"] is not None], 4),
            spread([statistics.median(row["bytes_sent_per_rank_to_target"]) / 1e9 for row, _ in hit], 3)
            + (" GB" if hit else ""),
            ", ".join(str(row["skipped_steps"]) for row in rows) + " |"]))
    lines += ["", "| optimizer | full-precision steps to it | s in them | s in compute to it | "
              "optimizer.step() s by phase (median of the runs' medians) | s of the whole run |",
              "| --- | ---: | ---: | ---: | --- | ---: |"]
    for name in names:
        rows = [next(r for r in result["runs"] if r["optimizer"] == name) for result in results]
        hit = [row for row in rows if row["reached"]]
        phases = [p for p in rows[0]["step_median_s_by_phase"]]
        steps = ", ".join(f"{p} {statistics.median(row['step_median_s_by_phase'][p] for row in rows):.3f}"
                          for p in phases)
        lines.append(" | ".join([
            f"| {name}", spread([row["full_steps_to_target"] for row in hit], 0),
            spread([row["seconds_in_full_steps_to_target"] for row in hit], 1),
            spread([row["seconds_in_compute_to_target"] for row in hit], 1), steps,
            spread([row["evals"][-1][1] for row in rows], 1) + " |"]))
    lines += ["", "Per run: AdamW's seconds, then each optimizer's AdamW s / s (its median compute s per step, "
              "forward and backward)", "",
              "| run | AdamW s | " + " | ".join(names[1:]) + " |", "| ---: | ---: |" + " ---: |" * (len(names) - 1)]
    for i, result in enumerate(results, 1):
        base = result["runs"][0]["seconds_to_target"]
        cells = [f"{base / r['seconds_to_target']:.2f}x ({r['compute_median_s']:.3f})" if r["reached"]
                 else f"not reached ({r['compute_median_s']:.3f})" for r in result["runs"][1:]]
        lines.append(f"| {i} | {base:.1f} | " + " | ".join(cells) + " |")
    walls = [result["wall_s"] for result in results]
    lines += ["", f"benchmark wall time (evaluations and start-up of each optimizer included, mpirun's start "
              f"not): {spread(walls, 0)} s"]
    loads = [load[0] for result in results
             for load in (result["setup"].get("loadavg_at_start"), result.get("loadavg_at_end")) if load]
    if loads:
        lines.append(f"1-minute load average at the runs' starts and ends (their own ranks included): "
                     f"{min(loads):.1f}-{max(loads):.1f} ({len(loads) // 2} runs recorded it) on "
                     f"{max(result['setup'].get('cpus') or 0 for result in results)} CPUs")
    return "\n".join(lines)


def main(paths):
    if not paths:
        raise SystemExit(__doc__)
    print(summary([json.loads(Path(p).read_text()) for p in paths]))


if __name__ == "__main__":
    main(sys.argv[1:])
