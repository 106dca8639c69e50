"""SGD with momentum trains the digits MLP (examples/python/small_models.py)
as a user would set it up (lr 0.05, momentum 0.9, Nesterov, a little weight
decay): at one rank to a loss at least as low as AdamW's with half of its
state, and at four ranks under mpirun with replicated state, ZeRO-2 and
compressed ZeRO int4/int8 (docs/optimizers/sgd.md "Training")."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))

import training_runs  # noqa: E402
from training_runs import RunSpec, run_local  # noqa: E402

WORKER = Path(__file__).with_name("mpi_real_models.py")
SGD = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-4}
ZERO2 = {"stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096}


def config(kind, zero=None, **params):
    c = {"optimizer": {"type": kind, "params": params}, "threads": 1}
    if zero:
        c["zero_optimization"] = zero
    return c


def test_sgd_trains_digits_as_well_as_adamw():
    results = run_local([RunSpec("adamw", "digits", config("AdamW", lr=1e-3, weight_decay=0.01)),
                         RunSpec("sgd", "digits", config("SGD", **SGD))])
    adamw, sgd = results["adamw"], results["sgd"]
    assert sgd.skipped == 0 and not sgd.error
    assert sgd.train_loss < 0.1 and sgd.train_loss <= adamw.train_loss, (sgd, adamw)
    assert sgd.test_accuracy > 0.93, sgd.test_accuracy
    assert sgd.losses[-1] < sgd.losses[0] / 10
    assert 2 * sgd.memory_bytes == adamw.memory_bytes


def test_sgd_trains_digits_on_four_ranks():
    missing = training_runs.mpi_available()
    if missing:
        pytest.skip(missing)
    specs = [RunSpec("sgd", "digits", config("SGD", **SGD), steps=300, batch=64, seed=0),
             RunSpec("sgd_zero2", "digits", config("SGD", zero=ZERO2, **SGD), steps=300, batch=64, seed=0),
             RunSpec("sgd_int4_int8", "digits",
                     config("SGD", zero=dict(ZERO2, compression={"gradients": "int4", "parameters": "int8"}),
                            **SGD), steps=300, batch=64, seed=0)]
    results = training_runs.run_under_mpirun([WORKER], specs, 4, timeout=400)
    for name, ranks in results.items():
        first = ranks[0]
        assert not first.error and first.skipped == 0, (name, first)
        assert first.train_loss < 0.15, (name, first.train_loss)
        assert first.test_accuracy > 0.93, (name, first.test_accuracy)
    # ZeRO-2 updates the same averaged gradients as the replicated state
    # (its sums run in another order at 4 ranks: fp32 rounding apart).
    assert results["sgd_zero2"][0].train_loss == pytest.approx(results["sgd"][0].train_loss, rel=1e-3)
