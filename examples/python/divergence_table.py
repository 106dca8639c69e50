"""Measures the divergence check of docs/reference/c-api.md ("Divergence that stays finite")
on the small models of small_models.py: healthy runs (the real-model
tests' runs: 1-bit Adam, 1-bit LAMB and 0/1 Adam stabilized, their
uncompressed references, AdamW, ZeRO-2) and stress runs, which may blow up
(1-bit LAMB at larger lr, 1-bit Adam with an early freeze_step, DeepSpeed's
rule), on 1 rank and on 4. User settings:
300 steps, global batch 64, weight decay 0.01, seed 0. Prints a Markdown
table: final training loss, skipped steps, the first step reported
diverging (counted from 1) and the episodes (the library's
StepInfo.diverging), and the margin: the largest factor at which the rule
would have reported (divergence_rule.margin; below 100, the default, means
not reported).

    python3 examples/python/divergence_table.py [--steps 300] [--models digits chars]
    python3 examples/python/divergence_table.py --transformers   (needs torch)
    python3 examples/python/divergence_table.py --replay SERIES.json ...

--transformers runs the tiny GPT of gpt.py instead (transformer_runs.py's
user settings, 300 steps, 4 ranks): the four optimizers and LAMB without
compression, then at larger learning rates, 1-bit Adam with freeze_step 2,
DeepSpeed's rule, and runs that blow up with every value finite (1-bit
LAMB and LAMB at lr 2e-1 and 5e-1, 1-bit Adam with DeepSpeed's rule and
freeze_step 10); the final loss column is then the validation loss.
Every table checks that the library reported what divergence_rule.replay
says.
--replay prints the same columns for recorded norm series instead
(divergence_rule.py's formats). The 4-rank rows run in one ``mpirun -np 4``
of this script (started by it; skipped, said so, without mpirun or mpi4py).
PYTHONPATH must reach the dsopt package (bindings/python).
"""
import argparse
import os
import warnings

os.environ.setdefault("OMP_NUM_THREADS", "1")  # read by libgomp: the ranks share the cores

import divergence_rule  # noqa: E402
import training_runs  # noqa: E402
from training_runs import RunSpec, adamw_config, lamb_config, onebit_config, zoadam_config  # noqa: E402

FREEZE = 45  # 15% of 300 steps, as the real-model tests

HEALTHY = {
    "1-bit Adam stabilized": onebit_config(FREEZE),
    "1-bit Adam uncompressed": onebit_config(100000),
    "1-bit LAMB stabilized": lamb_config(FREEZE),
    "1-bit LAMB uncompressed": lamb_config(100000),
    "0/1 Adam stabilized": zoadam_config(FREEZE),
    "AdamW": adamw_config(),
    "AdamW ZeRO-2": dict(adamw_config(), zero_optimization={"stage": 2, "reduce_bucket_size": 4096,
                                                            "allgather_bucket_size": 4096}),
}
STRESS = {
    "1-bit Adam, DeepSpeed's rule": onebit_config(FREEZE, stabilize=False, bias_correction=False),
    "1-bit LAMB, DeepSpeed's rule": lamb_config(FREEZE, stabilize=False),
    "0/1 Adam, DeepSpeed's rule": zoadam_config(FREEZE, stabilize=False, bias_correction=False),
    "1-bit LAMB lr 4e-2": lamb_config(FREEZE, lr=4e-2),
    "1-bit LAMB lr 8e-2": lamb_config(FREEZE, lr=8e-2),
    "1-bit LAMB lr 1.6e-1": lamb_config(FREEZE, lr=1.6e-1),
    "1-bit Adam lr 1e-2, freeze_step 10, DeepSpeed's rule": onebit_config(10, lr=1e-2, stabilize=False,
                                                                          bias_correction=False),
    "1-bit Adam lr 1e-2, freeze_step 2": onebit_config(2, lr=1e-2),
}
MPI_WORLD = 4

# transformer_runs cases: name -> (dsopt.torch class, options over the user settings)
TRANSFORMERS = {
    "healthy: AdamW": ("AdamW", {}),
    "healthy: 1-bit Adam": ("OneBitAdam", {}),
    "healthy: 1-bit LAMB": ("OneBitLamb", {}),
    "healthy: 0/1 Adam": ("ZeroOneAdam", {}),
    "healthy: LAMB without compression": ("OneBitLamb", {"freeze_step": 100000}),
    "stress: AdamW lr 1e-2": ("AdamW", {"lr": 1e-2}),
    "stress: 1-bit LAMB lr 4e-2": ("OneBitLamb", {"lr": 4e-2}),
    "stress: 1-bit Adam lr 1e-2": ("OneBitAdam", {"lr": 1e-2}),
    "stress: 1-bit Adam lr 3e-2": ("OneBitAdam", {"lr": 3e-2}),
    "stress: 1-bit Adam freeze_step 2": ("OneBitAdam", {"freeze_step": 2}),
    "stress: 0/1 Adam lr 1e-2": ("ZeroOneAdam", {"lr": 1e-2}),
    "stress: 0/1 Adam, DeepSpeed's rule": ("ZeroOneAdam", {"stabilize": False, "bias_correction": False}),
    "blow-up: 1-bit LAMB lr 2e-1": ("OneBitLamb", {"lr": 2e-1}),
    "blow-up: 1-bit LAMB lr 5e-1": ("OneBitLamb", {"lr": 5e-1}),
    "blow-up: LAMB without compression lr 2e-1": ("OneBitLamb", {"lr": 2e-1, "freeze_step": 100000}),
    "blow-up: 1-bit Adam, DeepSpeed's rule, freeze_step 10": (
        "OneBitAdam", {"stabilize": False, "bias_correction": False, "freeze_step": 10}),
}


def specs(models, steps):
    out = []
    for model in models:
        for kind, runs in (("healthy", HEALTHY), ("stress", STRESS)):
            for name, config in runs.items():
                out.append(RunSpec(f"{model}|{kind}|{name}", model, dict(config, report_grad_norm=True),
                                   steps=steps))
    return out


def columns(series, flags):
    """(first reported step or '-', episodes, margin) of one run (a
    divergence_rule.Series) whose steps reported `flags`; checks that they
    are what the rule says."""
    replayed, ratios = divergence_rule.replay(series.norms, series.local, series.world)
    if [bool(f) for f in flags] != replayed:
        raise AssertionError("the library's StepInfo.diverging differs from divergence_rule.replay")
    eps = divergence_rule.episodes(flags)
    return (eps[0][0] if eps else "-"), len(eps), divergence_rule.margin(ratios)


def row(cells):
    print("| " + " | ".join(str(c) for c in cells) + " |")


def print_header(first, loss="final train loss"):
    row([first, "ranks", loss, "skipped", "first reported", "episodes", "margin"])
    row(["---"] * 7)


def print_results(results, ranks):
    for name, result in results.items():
        model, kind, label = name.split("|")
        series = divergence_rule.Series(result.grad_norms, divergence_rule.local_steps(result.phases, ranks), ranks)
        first, eps, margin = columns(series, result.diverging)
        loss = f"stopped at step {result.error_step} (NonFiniteError)" if result.error \
            else f"{result.train_loss:.3g}"
        row([f"{model}, {kind}: {label}", ranks, loss, result.skipped, first, eps, f"{margin:.3g}"])


def transformer_rows(steps):
    import transformer_runs
    from transformer_runs import TransformerRun

    runs = [TransformerRun(name, cls, steps=steps, options=options, report_grad_norm=True)
            for name, (cls, options) in TRANSFORMERS.items()]
    print_header("tiny GPT run", "final validation loss")
    for name, per_rank in transformer_runs.run_under_mpirun(runs, MPI_WORLD, timeout=3600).items():
        r = per_rank[0]
        norms = [float("nan") if s else n for n, s in zip(r.info["grad_norm"], r.info["skipped"])]
        series = divergence_rule.Series(norms, divergence_rule.local_steps(r.info["phase"], MPI_WORLD), MPI_WORLD)
        first, eps, margin = columns(series, r.info["diverging"])
        loss = f"stopped at step {r.error_step} (NonFiniteError)" if r.error else f"{r.final_validation:.3g}"
        row([name, MPI_WORLD, loss, r.skipped, first, eps, f"{margin:.3g}"])


def replay_rows(paths):
    print_header("series")
    for path in paths:
        for name, series in divergence_rule.load_series(path).items():
            flags, _ = divergence_rule.replay(series.norms, series.local, series.world)
            first, eps, margin = columns(series, flags)
            skipped = sum(1 for n in series.norms if divergence_rule.is_nan(n))
            row([name, series.world, "-", skipped, first, eps, f"{margin:.3g}"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--models", nargs="+", default=["digits", "chars"])
    parser.add_argument("--replay", nargs="+", help="recorded norm series instead of runs")
    parser.add_argument("--transformers", action="store_true", help="the tiny GPT instead (torch)")
    parser.add_argument("--mpi-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import dsopt

    for quiet in (dsopt.DivergenceWarning, dsopt.SkippedStepWarning):  # the table reports them
        warnings.simplefilter("ignore", quiet)
    if args.mpi_worker:
        training_runs.mpi_worker_main(*args.mpi_worker)
        return
    if args.replay:
        replay_rows(args.replay)
        return
    if args.transformers:
        transformer_rows(args.steps)
        return
    print_header("run")
    print_results(training_runs.run_local(specs(args.models, args.steps)), 1)
    missing = training_runs.mpi_available()
    if missing:
        print(f"\n4-rank rows skipped: {missing}")
        return
    worker = [os.path.abspath(__file__), "--mpi-worker"]
    results = training_runs.run_under_mpirun(worker, specs(args.models, args.steps), MPI_WORLD, timeout=3600)
    print_results({name: per_rank[0] for name, per_rank in results.items()}, MPI_WORLD)


if __name__ == "__main__":
    main()
