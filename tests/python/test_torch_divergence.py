"""dsopt.torch optimizers report a divergence that stays finite as
dsopt.Optimizer does: last_step_info.diverging, and dsopt.DivergenceWarning
once per episode from step(). The loss is multiplied by 10,000 for a while
(every value finite), as a blow-up would.

Needs torch; `make test-torch` runs this file with a Python that has it."""

import warnings

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

BLOW_UPS = [(40, 55), (80, 90)]  # steps (from 1) whose loss is multiplied by 1e4


def loss_scale(step):
    return 1e4 if any(first <= step < end for first, end in BLOW_UPS) else 1.0


def train(make_optimizer, steps=110):
    """(per-step diverging flags, steps at which DivergenceWarning was issued)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = make_optimizer(model)
    flags, warned = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, steps + 1):
            gen = torch.Generator().manual_seed(step)
            x = torch.randn(32, 8, generator=gen)
            opt.zero_grad()
            (loss_scale(step) * model(x).pow(2).mean()).backward()
            opt.step()
            flags.append(opt.last_step_info.diverging)
            warned += [step for w in caught if issubclass(w.category, dsopt.DivergenceWarning)]
            caught.clear()
    return flags, warned


@pytest.mark.parametrize("make", [
    lambda model: dsopt.torch.AdamW(model.parameters(), lr=0.0),
    lambda model: dsopt.torch.Optimizer(
        model.parameters(), {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.0, "freeze_step": 20}}}),
], ids=["AdamW", "OneBitAdam config"])
def test_each_blow_up_warns_once_on_its_first_reported_step(make):
    flags, warned = train(make)
    firsts = [k for k in range(1, len(flags) + 1) if flags[k - 1] and (k == 1 or not flags[k - 2])]
    assert firsts == [first + 2 for first, _ in BLOW_UPS]  # the third step of each
    assert warned == firsts


def test_the_classes_take_divergence_check():
    flags, warned = train(lambda model: dsopt.torch.AdamW(model.parameters(), lr=0.0, divergence_check=False))
    assert not any(flags) and not warned
    tuned = {"factor": 1e6}  # the 1e4 blow-ups stay below it
    flags, warned = train(lambda model: dsopt.torch.OneBitLamb(model.parameters(), lr=0.0, divergence_check=tuned))
    assert not any(flags) and not warned
    flags, _ = train(lambda model: dsopt.torch.ZeroOneAdam(model.parameters(), lr=0.0, divergence_check=True))
    assert any(flags)


@pytest.mark.parametrize("value, error, words", [
    ("off", ValueError, "divergence_check"),
    ({"factor": 1.0}, dsopt.InvalidArgument, "divergence_check.factor"),
])
def test_bad_divergence_check_values_are_errors_naming_it(value, error, words):
    model = torch.nn.Linear(2, 1)
    with pytest.raises(error, match=words.replace(".", r"\.")):
        dsopt.torch.Adam(model.parameters(), divergence_check=value)
