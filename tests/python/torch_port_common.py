"""What test_torch_optim_port.py and its mpirun worker mpi_torch_drop_in.py
share: the optimizer classes paired with their torch.optim oracles, the fp32
comparisons, and the digits MLP with a frozen layer, a branch used only now
and then, and a branch nothing uses.

Tolerances (FP32_RTOL, FP32_ATOL). dsopt computes Adam in fp32 with its own
kernel, which orders the operations differently from torch's for-loop Adam
(fma, sqrt(v) * 1/sqrt(bc2) against sqrt(v) / sqrt(bc2), the constants
formed in fp32), so the two agree to fp32 rounding, not bit for bit: one
update, lr * m_hat / (sqrt(v_hat) + eps), differs by a few ulp of itself,
about 1e-7 * lr per element and step. The tests give both optimizers the
same gradients (computed once, on dsopt's model), so nothing feeds the
drift back, and over the <= 20 steps with lr <= 0.05 used on unit-scale
parameters the parameters stay within a few 1e-7 (measured: at most 0.15 of
the tolerance below, except right after the state was overwritten with
zeros), so rtol 1e-5 / atol 1e-6, the tolerances torch's own optimizer
tests use for comparing two fp32 implementations, hold with margin, while
a wrong hyperparameter, a missed or extra step or a wrong bias correction
moves parameters by ~lr = 1e-3..1e-2 and fails them (so does an lr off by
1e-4 of itself). The digits run trains two independent models instead and
compares losses (see that test).

The moments are compared in the units of the gradients: exp_avg, and
sqrt(exp_avg_sq), each with the parameters' tolerances (a fixed atol on
exp_avg_sq itself, ~grad**2, would accept anything). dsopt forms 1 - beta2
in fp32, so its exp_avg_sq is torch's times (1 - fp32(beta2)) / (1 - beta2)
(1 - 1.3e-5 for the default 0.999: sqrt(v) 6.4e-6 low, within rtol 1e-5;
see test_exp_avg_sq_differs_from_torchs_only_by_the_fp32_rounding_of_one_minus_beta2).

Where dsopt promises bits, the tests compare bits (torch.equal): a parameter
whose .grad is None is not touched, and two dsopt optimizers resumed from
the same state step identically.
"""

import sys
from pathlib import Path

import numpy as np
import torch

import dsopt.torch  # noqa: F401  (dsopt.torch.Adam / AdamW)

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent.parent / "examples" / "python"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

FP32_RTOL = 1e-5
FP32_ATOL = 1e-6


def classes(name):
    """(dsopt class, torch.optim class) for "Adam" or "AdamW"."""
    return getattr(dsopt.torch, name), getattr(torch.optim, name)


def assert_param_close(actual, expected, what, rtol=FP32_RTOL, atol=FP32_ATOL):
    torch.testing.assert_close(actual.detach().cpu(), expected.detach().cpu(), rtol=rtol,
                               atol=atol, msg=lambda m: f"{what}: {m}")


def assert_moment_close(actual, expected, what, squared=False, rtol=FP32_RTOL, atol=FP32_ATOL):
    """exp_avg, or (squared) exp_avg_sq compared as its square root."""
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if squared:
        actual, expected = actual.sqrt(), expected.sqrt()
        what = f"sqrt({what})"
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def state_of(opt, p):
    """opt.state[p] as a plain dict, {} where there is none (without making
    an entry in torch's defaultdict)."""
    return dict(opt.state[p]) if p in opt.state else {}


def step_count(state):
    """The "step" of a per-parameter state (0 where there is no state)."""
    if not state:
        return 0.0
    step = state["step"]
    return float(step.item() if torch.is_tensor(step) else step)


def assert_state_close(ours, theirs, p_ours, p_theirs, what):
    """Adam state of p_ours in dsopt optimizer ``ours`` against p_theirs in
    torch optimizer ``theirs``: the same step count (exactly), moments within
    fp32 rounding. A parameter torch has no state for (never updated) has
    none in dsopt either, or one at step 0 with zero moments."""
    a, b = state_of(ours, p_ours), state_of(theirs, p_theirs)
    assert step_count(a) == step_count(b), f"{what}: step {step_count(a)} vs torch's {step_count(b)}"
    if not b:
        if a:
            assert not a["exp_avg"].any() and not a["exp_avg_sq"].any(), \
                f"{what}: torch has no state (never updated) but dsopt's moments are not zero"
        return
    for key in ("exp_avg", "exp_avg_sq"):
        assert key in a, f"{what}: dsopt state has no {key!r} (keys {sorted(a)})"
        assert a[key].shape == b[key].shape, f"{what}: {key} shape {a[key].shape} vs {b[key].shape}"
        assert_moment_close(a[key], b[key], f"{what} {key}", squared=key == "exp_avg_sq")


def snapshot_state(opt, p):
    """Clones of opt.state[p]'s tensors (to check them unchanged bit for bit)."""
    return {k: (v.detach().clone() if torch.is_tensor(v) else v)
            for k, v in state_of(opt, p).items()}


def assert_state_unchanged(opt, p, before, what):
    after = state_of(opt, p)
    assert sorted(after) == sorted(before), f"{what}: state keys {sorted(before)} -> {sorted(after)}"
    for k, v in before.items():
        w = after[k]
        if torch.is_tensor(v):
            assert torch.equal(w.detach().cpu(), v.cpu()), f"{what}: state {k!r} changed"
        else:
            assert w == v, f"{what}: state {k!r} changed: {v!r} -> {w!r}"


# ---- the digits MLP ----------------------------------------------------------------------


def digits_tensors():
    """(x, y) tensors: the training part of scikit-learn's digits (pixels in [0, 1])."""
    from small_models import load_digits_split

    data = load_digits_split()
    return torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)


def digits_test_tensors():
    from small_models import load_digits_split

    data = load_digits_split()
    return torch.from_numpy(data.x_test), torch.from_numpy(data.y_test)


class DigitsNet(torch.nn.Module):
    """64 -> hidden (ReLU) -> hidden (tanh) -> 10, plus ``side``, a second
    head added to the output only when forward is asked to (``use_side``),
    and ``unused``, which forward never uses."""

    def __init__(self, hidden=32, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Linear(64, hidden)
        self.body = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, 10)
        self.side = torch.nn.Linear(hidden, 10)
        self.unused = torch.nn.Linear(hidden, 10)

    def forward(self, x, use_side=False):
        h = torch.tanh(self.body(torch.relu(self.embed(x))))
        out = self.head(h)
        if use_side:
            out = out + self.side(h)
        return out


def batches(n_samples, batch, steps, seed=1):
    """``steps`` index arrays of ``batch`` distinct samples each."""
    draw = np.random.RandomState(seed)
    return [draw.choice(n_samples, batch, replace=False) for _ in range(steps)]
