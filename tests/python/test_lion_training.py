"""Lion trains the digits MLP (examples/python/small_models.py) to a loss
at least as low as AdamW's at the same learning rate, with half its state
(docs/optimizers/lion.md "Training")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))

from training_runs import RunSpec, run_local  # noqa: E402


def config(kind, lr, weight_decay):
    return {"optimizer": {"type": kind, "params": {"lr": lr, "weight_decay": weight_decay}},
            "threads": 1}


def test_lion_trains_digits_as_well_as_adamw():
    results = run_local([RunSpec("adamw", "digits", config("AdamW", 1e-3, 0.01)),
                         RunSpec("lion", "digits", config("Lion", 1e-3, 0.01))])
    adamw, lion = results["adamw"], results["lion"]
    assert lion.skipped == 0 and not lion.error
    assert lion.train_loss < 0.1 and lion.train_loss <= adamw.train_loss, (lion, adamw)
    assert lion.test_accuracy > 0.93, lion.test_accuracy
    assert lion.losses[-1] < lion.losses[0] / 5
    assert 2 * lion.memory_bytes == adamw.memory_bytes
