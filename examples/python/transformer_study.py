"""The 1-bit optimizers against AdamW on the GPT of gpt.py: final validation
loss relative to the baseline, mean over seeds.

Runs, per model size and corpus and per seed, at P ranks (default 4) with
transformer_runs' user settings: AdamW, OneBitAdam, ZeroOneAdam, OneBitLamb
and LAMB without compression (OneBitLamb with freeze_step after the run).
The baseline of 1-bit Adam and 0/1 Adam is AdamW; that of 1-bit LAMB is
the better of AdamW and uncompressed LAMB (per seed). The goal: every
ratio's mean within 3% of 1, no skipped step.

    python3 examples/python/transformer_study.py [--seeds 0,1,2] [--ranks 4]
        [--models tiny:licenses,small:python] [--steps 300]
        [--results study.json] [--extra NAME:CLASS:JSON_OPTIONS ...] [--plot DIR]

``--extra`` adds runs of a variant (e.g. ``zo_interval1:ZeroOneAdam:
'{"local_step_scaler": 1, "local_step_clipper": 1}'``), compared with
AdamW. Results accumulate in the --results file (runs already there are
not run again), one mpirun per model and seed. Needs torch and mpi4py
(Debian's /usr/bin/python3 with python3-torch and python3-mpi4py).
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import transformer_runs
from transformer_runs import TransformerRun

BASE_RUNS = {  # name -> (class, options over the user settings)
    "AdamW": ("AdamW", {}),
    "OneBitAdam": ("OneBitAdam", {}),
    "ZeroOneAdam": ("ZeroOneAdam", {}),
    "OneBitLamb": ("OneBitLamb", {}),
    "LAMB": ("OneBitLamb", {"freeze_step": None}),  # None: after the run
}


def runs_for(model, corpus, seed, steps, extra, base_runs=None):
    """The TransformerRuns of one model and seed: BASE_RUNS (or those
    named in `base_runs`) and `extra` ({name: (class, options)}), named
    model/corpus/seed/name."""
    runs = []
    base = {n: BASE_RUNS[n] for n in (BASE_RUNS if base_runs is None else base_runs)}
    for name, spec in {**base, **extra}.items():
        fields = dict(spec) if isinstance(spec, dict) else {"optimizer": spec[0], "options": spec[1]}
        fields["options"] = {k: (steps + 1 if v is None else v) for k, v in fields.get("options", {}).items()}
        runs.append(TransformerRun(f"{model}/{corpus}/{seed}/{name}", size=model, corpus=corpus, steps=steps,
                                   seed=seed, **fields))
    return runs


def run_study(models, seeds, steps, ranks, results_path, extra, base_runs=None, worker_args=None):
    """Runs what the results file lacks; returns {name: [result per rank]}.
    extra: {name: (class, options)} or {name: TransformerRun fields}, the
    name, size, corpus, steps and seed filled in; worker_args: the mpirun worker
    command (default transformer_runs.py)."""
    path = Path(results_path)
    results = transformer_runs.load_results(path) if path.exists() else {}
    for model, corpus in models:
        for seed in seeds:
            todo = [r for r in runs_for(model, corpus, seed, steps, extra, base_runs) if r.name not in results]
            if not todo:
                continue
            start = time.perf_counter()
            got = transformer_runs.run_under_mpirun(todo, ranks, timeout=600 + 120 * len(todo),
                                                    worker_args=worker_args)
            print(f"{model}/{corpus} seed {seed}: {len(todo)} runs in {time.perf_counter() - start:.0f} s",
                  flush=True)
            results.update(got)
            transformer_runs.save_results(results, path)
    return results


def baseline_name(name):
    """The run(s) a run is compared with: 1-bit LAMB's (OneBitLamb and
    variants named OneBitLamb_*) the better of AdamW and LAMB."""
    return ["AdamW", "LAMB"] if name.split("_")[0] == "OneBitLamb" else ["AdamW"]


def table(results, models, seeds, names):
    """Markdown rows: per model and run, the final validation loss (rank 0)
    per seed, its ratio to the baseline per seed and their mean, the
    skipped steps, the bytes sent relative to AdamW's and the training
    seconds (rank 0, median over seeds)."""
    lines = ["| model | run | final validation loss per seed | ratio to baseline per seed | mean ratio "
             "| skipped | bytes vs AdamW | seconds (median) |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for model, corpus in models:
        for name in names:
            finals, ratios, skipped, byte_ratios, seconds = [], [], 0, [], []
            for seed in seeds:
                key = f"{model}/{corpus}/{seed}"
                if f"{key}/{name}" not in results:
                    continue
                ranks = results[f"{key}/{name}"]
                final = ranks[0].final_validation
                base = min(results[f"{key}/{b}"][0].final_validation for b in baseline_name(name))
                finals.append(final)
                ratios.append(final / base)
                skipped += sum(r.skipped for r in ranks) + sum(bool(r.error) for r in ranks)
                sent = sum(sum(r.info["bytes_sent"]) for r in ranks)
                adamw_sent = sum(sum(r.info["bytes_sent"]) for r in results[f"{key}/AdamW"])
                byte_ratios.append(sent / adamw_sent if adamw_sent else float("nan"))
                seconds.append(ranks[0].seconds)
            if not finals:
                continue
            lines.append(f"| {model}/{corpus} | {name} | {', '.join(f'{f:.4f}' for f in finals)} | "
                         f"{', '.join(f'{r:.3f}' for r in ratios)} | {statistics.mean(ratios):.3f} | {skipped} | "
                         f"{statistics.median(byte_ratios):.3f} | {statistics.median(seconds):.1f} |")
    return "\n".join(lines)


def curves(results, model, corpus, seeds, name):
    """[(step, mean validation loss over the seeds)] of a run (rank 0)."""
    per_seed = [results[f"{model}/{corpus}/{s}/{name}"][0].validation for s in seeds]
    return [(points[0][0], statistics.mean(p[1] for p in points)) for points in zip(*per_seed)]


def curve_table(results, model, corpus, seeds, names):
    steps = [s for s, _ in curves(results, model, corpus, seeds, "AdamW")]
    lines = ["| run | " + " | ".join(str(s) for s in steps) + " |",
             "| --- |" + " ---: |" * len(steps)]
    for name in ["AdamW", *names]:
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for _, v in curves(results, model, corpus, seeds, name))
                     + " |")
    return "\n".join(lines)


def plot(results, model, corpus, seeds, names, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in ["AdamW", *names]:
        steps, values = zip(*curves(results, model, corpus, seeds, name))
        ax.plot(steps, values, label=name, linewidth=2.5 if name == "AdamW" else 1.2,
                color="black" if name == "AdamW" else None)
    ax.set_xlabel("step")
    ax.set_ylabel(f"validation loss (nats/byte, mean of {len(seeds)} seeds)")
    ax.set_title(f"{model} GPT on {corpus}, 4 ranks")
    ax.set_ylim(top=min(4.5, ax.get_ylim()[1]))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_extra(items):
    extra = {}
    for item in items:
        name, cls, options = item.split(":", 2)
        extra[name] = (cls, json.loads(options))
    return extra


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--models", default="tiny:licenses,small:python")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--results", default="transformer_study.json")
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--plot", default="", help="a folder: validation curves per model (PNG), "
                        "and their table on stdout")
    args = parser.parse_args()
    models = [tuple(m.split(":")) for m in args.models.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = parse_extra(args.extra)
    results = run_study(models, seeds, args.steps, args.ranks, args.results, extra)
    names = [*BASE_RUNS, *extra]
    print(table(results, models, seeds, names))
    if args.plot:
        Path(args.plot).mkdir(parents=True, exist_ok=True)
        for model, corpus in models:
            print(f"\nValidation loss, {model}/{corpus}, mean of seeds {seeds}:\n")
            print(curve_table(results, model, corpus, seeds, names[1:]))
            plot(results, model, corpus, seeds, names[1:], Path(args.plot) / f"{model}-{corpus}.png")


if __name__ == "__main__":
    main()
