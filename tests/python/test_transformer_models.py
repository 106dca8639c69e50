"""The 1-bit optimizers train a small transformer language model like
AdamW: the tiny GPT of examples/python/gpt.py on the license texts of
/usr/share/common-licenses (byte-level, 42,880 parameters), with
examples/python/transformer_runs.py's user settings (lr 1e-3, 1-bit LAMB
1e-2, weight_decay 0.01, freeze_step / var_freeze_step at 15% of the run,
10% warmup then cosine, global batch 16 sequences of 32 bytes, 300 steps).

* 4 ranks (one ``mpirun -np 4``): every run ends without a skipped step
  or error, the compressed stages really ran (most steps sent ~1/32 of the
  bytes), and every 1-bit optimizer ends within LOSS_RATIO_LIMIT of its
  baseline's final validation loss (AdamW for 1-bit Adam and 0/1 Adam, the
  better of AdamW and LAMB without compression for 1-bit LAMB;
  docs/design/zero-one-adam-transformers.md has the study).
* 1 rank (in this process): 1-bit Adam within LOSS_RATIO_LIMIT of AdamW.

Needs torch (skips without it: tests/python/run_torch_tests.sh runs it
with a Python that has torch) and, for the 4-rank part, mpirun and mpi4py.
"""
import sys

import pytest

import conftest
from dsopt_testing import skip_unless_mpi_runs

pytest.importorskip("torch")
sys.path.insert(0, str(conftest.REPO_ROOT / "examples" / "python"))
import training_runs  # noqa: E402
import transformer_runs  # noqa: E402
from transformer_runs import TransformerRun  # noqa: E402

STEPS = 300
# Final validation loss over the baseline's. At 4 ranks over seeds 0-2
# (examples/python/transformer_study.py) a ratio varies by about +-0.01
# between seeds, AdamW's final loss by 1%: the goal (within 3%, mean over
# seeds) plus that spread for one seed. Seed 0 here: 1-bit Adam 1.004,
# 0/1 Adam 0.989, 1-bit LAMB 1.030.
LOSS_RATIO_LIMIT = 1.05
RUNS = {
    "AdamW": ("AdamW", {}),
    "OneBitAdam": ("OneBitAdam", {}),
    "ZeroOneAdam": ("ZeroOneAdam", {}),
    "OneBitLamb": ("OneBitLamb", {}),
    "LAMB": ("OneBitLamb", {"freeze_step": STEPS + 1}),
}
BASELINES = {"OneBitAdam": ["AdamW"], "ZeroOneAdam": ["AdamW"], "OneBitLamb": ["AdamW", "LAMB"]}
# The compressed runs' bytes over AdamW's, at most (the warmup sends full
# gradients for 15% of the steps).
BYTES_FRACTION = 0.3


def transformer_run(name):
    cls, options = RUNS[name]
    return TransformerRun(name, cls, size="tiny", corpus="licenses", steps=STEPS, seed=0, eval_every=STEPS,
                          options=options)


@pytest.fixture(scope="module")
def four_ranks():
    """{name: [TransformerResult of each rank]} of the one mpirun -np 4."""
    skip_unless_mpi_runs(training_runs.mpi_available())
    try:
        return transformer_runs.run_under_mpirun([transformer_run(n) for n in RUNS], 4, timeout=400)
    except training_runs.MpirunFailed as e:
        pytest.fail(str(e))


def ratio(results, name):
    """results: {name: TransformerResult of rank 0 (or the only rank)}."""
    base = min(results[b].final_validation for b in BASELINES[name])
    return results[name].final_validation / base


@pytest.mark.parametrize("name", list(BASELINES))
def test_trains_without_skips_on_4_ranks(name, four_ranks):
    for rank, result in enumerate(four_ranks[name]):
        assert not result.error and result.skipped == 0, f"{name}, rank {rank}: {result.skipped}, {result.error}"
    sent = sum(sum(r.info["bytes_sent"]) for r in four_ranks[name])
    sent_adamw = sum(sum(r.info["bytes_sent"]) for r in four_ranks["AdamW"])
    assert sent < BYTES_FRACTION * sent_adamw, (sent, sent_adamw)
    assert sum(four_ranks[name][0].info["compressed"]) > STEPS // 2


def test_no_divergence_reported_on_healthy_runs(four_ranks):
    """The divergence check (on by default) stays silent on every run here,
    baselines included, on every rank."""
    for name, results in four_ranks.items():
        for rank, result in enumerate(results):
            assert not any(result.info["diverging"]), f"{name}, rank {rank}: divergence reported"


@pytest.mark.parametrize("name", list(BASELINES))
def test_within_goal_of_baseline_on_4_ranks(name, four_ranks):
    got = ratio({n: rs[0] for n, rs in four_ranks.items()}, name)
    assert got <= LOSS_RATIO_LIMIT, f"{name}: final validation loss {got:.3f} x the baseline's"


def test_adamw_learns(four_ranks):
    """The baseline itself trains: far below the uniform byte loss ln 256 = 5.55."""
    adamw = four_ranks["AdamW"][0]
    assert adamw.validation[0][1] > 5.4 and adamw.final_validation < 3.5, adamw.validation


def test_onebit_adam_trains_like_adamw_on_1_rank():
    results = transformer_runs.run_local([transformer_run("AdamW"), transformer_run("OneBitAdam")])
    run = results["OneBitAdam"]
    assert not run.error and run.skipped == 0, (run.skipped, run.error)
    assert sum(run.info["compressed"]) > STEPS // 2
    got = ratio(results, "OneBitAdam")
    assert got <= LOSS_RATIO_LIMIT, f"1 rank: final validation loss {got:.3f} x AdamW's"
