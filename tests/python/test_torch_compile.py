"""dsopt.torch under torch.compile: ``opt.step`` compiled alone, and a
whole training step (forward, backward, ``opt.step()``) compiled, give the
parameters of the eager run bit for bit; ``step()`` and ``zero_grad()``
run eagerly (a graph break around them). The "eager" backend keeps this
quick: what is tested is dynamo tracing code that calls the optimizer, not
code generation.

Needs torch >= 2.1 (skips otherwise); `make test-frameworks` runs it under
PyPI's torch."""

import warnings

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-frameworks` runs these tests "
    "under PyPI's torch")
if not hasattr(torch, "compile") or not hasattr(torch, "_disable_dynamo"):
    pytest.skip(f"torch {torch.__version__}: dsopt.torch runs under torch.compile from torch "
                f"2.1 on", allow_module_level=True)

import dsopt.torch  # noqa: E402

STEPS = 4


def make(kind, overlap=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overlap without hooks
        if kind == "onebit":
            opt = dsopt.torch.OneBitAdam(model.parameters(), lr=0.01, freeze_step=2,
                                         overlap=overlap)
        else:
            opt = dsopt.torch.AdamW(model.parameters(), lr=0.01, weight_decay=0.01,
                                    zero_stage=2 if kind == "zero2" else None, overlap=overlap)
    return model, opt


def batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen)


def run(kind, compile_step=False, compile_train_step=False, overlap=False):
    """(losses, parameters) of STEPS steps."""
    torch._dynamo.reset()
    model, opt = make(kind, overlap)
    step = torch.compile(opt.step, backend="eager") if compile_step else opt.step

    def train_step(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        step()
        return loss.detach()

    if compile_train_step:
        train_step = torch.compile(train_step, backend="eager")
    losses = [float(train_step(*batch(k))) for k in range(STEPS)]
    assert opt.last_step_info.step == STEPS
    opt.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def assert_same(got, want):
    assert got[0] == want[0], "losses differ"
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1])), "parameters differ"


@pytest.mark.parametrize("kind", ["adamw", "zero2", "onebit"])
def test_compiled_step_equals_eager(kind):
    assert_same(run(kind, compile_step=True), run(kind))


@pytest.mark.parametrize("overlap", [False, True], ids=["reading_grad", "overlap"])
@pytest.mark.parametrize("kind", ["adamw", "onebit"])
def test_compiled_training_step_equals_eager(kind, overlap):
    assert_same(run(kind, compile_train_step=True, overlap=overlap), run(kind, overlap=overlap))
