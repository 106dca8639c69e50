"""Compressed ZeRO-2 against uncompressed ZeRO-2 on real models at P ranks
(default 4): the final loss of every codec pair, with error feedback and
without it beside, and the bytes each rank sends per step.

* the digits MLP of small_models.py (scikit-learn's digits), 300 steps,
  global batch 64, AdamW lr 1e-3, weight decay 0.01, buckets of 4,096
  elements (smaller than its largest tensor): final training loss;
* the GPT of gpt.py (``tiny`` on Debian's license texts) through
  dsopt.torch.AdamW with transformer_runs' user settings (300 steps,
  warmup then cosine): final validation loss. 1-bit Adam (stage 0, its
  compressed stage after 15% of the run) runs beside it: the other way to
  send about 1 bit per element.

Every variant differs from its baseline in ``"compression"`` alone. The
goal (docs/guides/compressed-zero.md "Measured"): with error feedback the
int8 and int4 gradient codecs end within 1% of uncompressed ZeRO-2.

    python3 examples/python/compressed_zero_study.py [--seeds 0,1,2]
        [--ranks 4] [--steps 300] [--results compressed_zero_study.json]
        [--skip-transformer]

Results accumulate in the --results file (runs already there are not run
again). Needs mpi4py, and torch for the transformer.
"""
import argparse
import json
import statistics
from pathlib import Path

import training_runs

# name -> compression section (None: uncompressed ZeRO-2, the baseline)
VARIANTS = {
    "ZeRO-2": None,
    "int8/bf16": {"gradients": "int8", "parameters": "bf16"},
    "int8/int8": {"gradients": "int8", "parameters": "int8"},
    "int4/int8": {"gradients": "int4", "parameters": "int8"},
    "sign/int8": {"gradients": "sign", "parameters": "int8"},
    "int8/int8 no EF": {"gradients": "int8", "parameters": "int8", "error_feedback": False},
    "int4/int8 no EF": {"gradients": "int4", "parameters": "int8", "error_feedback": False},
    "sign/int8 no EF": {"gradients": "sign", "parameters": "int8", "error_feedback": False},
}
BUCKET = 4096


def zero_section(compression, bucket=None):
    section = {"stage": 2}
    if bucket:
        section.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    if compression:
        section["compression"] = dict(compression)
    return section


def digits_specs(seed, steps):
    specs = []
    for name, compression in VARIANTS.items():
        config = training_runs.adamw_config()
        config["zero_optimization"] = zero_section(compression, BUCKET)
        specs.append(training_runs.RunSpec(f"digits/{seed}/{name}", "digits", config, steps=steps, seed=seed))
    return specs


def run_digits(seeds, steps, ranks, results):
    todo = [s for seed in seeds for s in digits_specs(seed, steps) if s.name not in results]
    if todo:
        got = training_runs.run_under_mpirun([__file__, "--mpi-worker"], todo, ranks,
                                             timeout=300 + 60 * len(todo))
        for name, per_rank in got.items():
            results[name] = {"loss": per_rank[0].train_loss,
                             "bytes_per_step": per_rank[0].bytes_sent / steps,
                             "memory": per_rank[0].memory_bytes}


def run_transformer(seeds, steps, ranks, results, path):
    import transformer_study
    from transformer_runs import TransformerRun  # noqa: F401  (torch is needed from here on)

    extra = {name: ("AdamW", {"zero_optimization": zero_section(c)}) for name, c in VARIANTS.items()}
    extra["1-bit Adam"] = ("OneBitAdam", {})
    study_path = Path(path).with_suffix(".transformer.json")
    got = transformer_study.run_study([("tiny", "licenses")], seeds, steps, ranks, study_path, extra,
                                      base_runs=[])
    for name, per_rank in got.items():
        model, corpus, seed, variant = name.split("/", 3)
        sent = per_rank[0].info.get("bytes_sent", [])
        results[f"gpt/{seed}/{variant}"] = {
            "loss": per_rank[0].final_validation,
            "bytes_per_step": statistics.median(sent) if sent else float("nan")}


def table(results, model, seeds, names, what):
    rows = [f"| {what} | final loss (mean) | / ZeRO-2 (mean, min-max over seeds) | bytes per step per rank | "
            "x fewer |", "| --- | --- | --- | --- | --- |"]
    base = [results[f"{model}/{s}/ZeRO-2"] for s in seeds]
    for name in names:
        got = [results.get(f"{model}/{s}/{name}") for s in seeds]
        if any(g is None for g in got):
            continue
        ratios = [g["loss"] / b["loss"] for g, b in zip(got, base)]
        sent = statistics.median(g["bytes_per_step"] for g in got)
        base_sent = statistics.median(b["bytes_per_step"] for b in base)
        rows.append(f"| {name} | {statistics.mean(g['loss'] for g in got):.4f} | "
                    f"{statistics.mean(ratios):.4f} ({min(ratios):.4f}-{max(ratios):.4f}) | "
                    f"{sent:,.0f} | {base_sent / sent:.2f} |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--results", default="compressed_zero_study.json")
    parser.add_argument("--skip-transformer", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    path = Path(args.results)
    results = json.loads(path.read_text()) if path.exists() else {}
    run_digits(seeds, args.steps, args.ranks, results)
    path.write_text(json.dumps(results, indent=1))
    print(f"digits MLP, {args.ranks} ranks, {args.steps} steps, seeds {seeds}:\n")
    print(table(results, "digits", seeds, VARIANTS, "digits MLP"))
    if not args.skip_transformer:
        run_transformer(seeds, args.steps, args.ranks, results, path)
        path.write_text(json.dumps(results, indent=1))
        print(f"\nGPT tiny on Debian's license texts, {args.ranks} ranks, {args.steps} steps, seeds {seeds}:\n")
        print(table(results, "gpt", seeds, [*VARIANTS, "1-bit Adam"], "GPT tiny"))


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--mpi-worker"]:
        training_runs.mpi_worker_main(*sys.argv[2:])
    else:
        main()
