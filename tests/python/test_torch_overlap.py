"""dsopt.torch.Optimizer(overlap=True): gradients handed to dsopt from
post-accumulate-grad hooks during backward (torch >= 2.1) give the
parameters of overlap=False bit for bit, with gradient accumulation too;
.grad is None after backward; close() removes the hooks; with torch < 2.1
(or without the hook API) it warns and hands .grad over in step(), with the
same results. One process, and 4 ranks under mpirun (mpi_torch_overlap.py).

Needs torch; `make test-torch` runs this file with a Python that has it."""

import gc
import shutil
import sys
import warnings
import weakref
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
import mpi_runner  # noqa: E402
import mpi_torch_overlap as ov  # noqa: E402
from dsopt_testing import build_feature  # noqa: E402

HOOKS = dsopt.torch._optimizer._has_post_accumulate_grad_hooks()
needs_hooks = pytest.mark.skipif(
    not HOOKS,
    reason=f"torch {torch.__version__} has no Tensor.register_post_accumulate_grad_hook "
    f"(torch >= 2.1): overlap=True falls back to reading .grad in step(), tested by "
    f"test_without_hooks_it_warns_and_steps_the_same",
)

CONFIGS = {
    "adam": ov.ADAM,
    "adamw_clipping": dict(ov.ADAMW, gradient_clipping=0.05),
    "zero1": ov.zero(ov.ADAMW, 1),
    "zero2": ov.zero(ov.ADAMW, 2),
}


def accumulating(config, g=2):
    return dict(config, gradient_accumulation_steps=g)


@needs_hooks
@pytest.mark.parametrize("name", CONFIGS)
def test_overlap_steps_bit_identically_to_reading_grad(name):
    config = CONFIGS[name]
    got, info = ov.run(config, True, steps=5)
    want, want_info = ov.run(config, False, steps=5)
    assert not ov.differences(got, want), f"parameters {ov.differences(got, want)} differ"
    assert info.grad_norm == want_info.grad_norm


@needs_hooks
@pytest.mark.parametrize("name", CONFIGS)
def test_gradient_accumulation_hands_over_each_backward_pass(name):
    """G = 2: two backward passes per step, each on its own micro-batch's
    loss; overlap=False accumulates .grad of the loss divided by 2."""
    config = accumulating(CONFIGS[name])
    got, _ = ov.run(config, True, steps=4, micro_batches=2)
    want, _ = ov.run(config, False, steps=4, micro_batches=2,
                     reference_config=ov.without_accumulation(config))
    assert not ov.differences(got, want), f"parameters {ov.differences(got, want)} differ"


@needs_hooks
def test_grad_is_none_after_backward():
    model, opt = ov.make(accumulating(ov.ADAM), True)
    seen = []

    def check(model):
        seen.append([p.grad is None for p in model.parameters()])

    ov.train(model, opt, 2, micro_batches=2, check_grads=check)
    opt.close()
    assert len(seen) == 4 and all(all(row) for row in seen), seen


@needs_hooks
def test_close_removes_the_hooks():
    model, opt = ov.make(ov.ADAM, True)
    ov.train(model, opt, 1)
    opt.close()
    x, y = ov.batch(0)
    torch.nn.functional.mse_loss(model(x, 0), y).backward()
    assert all(p.grad is not None for p in model.parameters())


@needs_hooks
def test_hooks_do_not_keep_the_optimizer_alive():
    model, opt = ov.make(ov.ADAM, True)
    ov.train(model, opt, 1)
    inner = weakref.ref(opt.dsopt)
    del opt
    gc.collect()
    assert inner() is None  # destroyed with its torch optimizer (local communicator)
    x, y = ov.batch(0)
    torch.nn.functional.mse_loss(model(x, 0), y).backward()  # the hooks do nothing
    assert all(p.grad is not None for p in model.parameters())


@needs_hooks
def test_frozen_parameters_get_no_hook_and_are_absent_as_without_overlap():
    def run(overlap):
        model = ov.Net()
        model.body[0].weight.requires_grad_(False)
        opt = dsopt.torch.Optimizer(model.parameters(), ov.ADAMW, overlap=overlap)
        ov.train(model, opt, 3)
        opt.close()
        return list(model.parameters())

    got, want = run(True), run(False)
    assert not ov.differences(got, want)


@needs_hooks
def test_unhooked_parameter_whose_hand_over_failed_is_handed_over_later():
    model = ov.Net()
    frozen = model.extra.bias
    frozen.requires_grad_(False)
    opt = dsopt.torch.Optimizer(model.parameters(), ov.ADAM, overlap=True)
    frozen.requires_grad_(True)
    frozen.grad = torch.ones(1).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        opt.step()
    before = frozen.detach().clone()
    frozen.grad = torch.ones(1)
    opt.step()
    assert frozen < before  # handed over at step, then hooked
    frozen.sum().backward()
    assert frozen.grad is None  # its hook handed it over
    opt.step()
    opt.close()


@needs_hooks
@pytest.mark.parametrize("name", ["adam", "zero2"])
def test_grad_assigned_without_backward_is_stepped_as_without_overlap(name):
    """.grad set by the caller (no backward pass, so no hook saw it), for
    every parameter on some steps and beside a backward pass on others:
    step() hands it over, as overlap=False steps with it."""
    def steps(overlap):
        model, opt = ov.make(CONFIGS[name], overlap)
        params = list(model.parameters())
        for step in range(4):
            opt.zero_grad()
            x, y = ov.batch(step)
            if step % 2 == 0:
                grads = torch.autograd.grad(
                    torch.nn.functional.mse_loss(model(x, step), y), params)
                for p, g in zip(params, grads):
                    p.grad = g
            else:
                torch.nn.functional.mse_loss(model.body(x), y).backward()
                model.extra.weight.grad = torch.full_like(model.extra.weight, 0.5)
            opt.step()
        opt.close()
        return [p.detach().clone() for p in params]

    got, want = steps(True), steps(False)
    assert not ov.differences(got, want), f"parameters {ov.differences(got, want)} differ"


def test_step_without_backward_steps_with_absent_gradients():
    model = ov.Net()
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # torch < 2.1
        opt = dsopt.torch.Optimizer(model.parameters(), ov.ADAM, overlap=True)
    opt.step()
    assert opt.last_step_info.step == 1
    assert not ov.differences(list(model.parameters()), before)  # Adam: no move on zeros
    ov.train(model, opt, 2)  # hand-overs work afterwards
    assert opt.last_step_info.step == 3
    opt.close()


def test_overlap_is_off_by_default_and_add_param_group_hooks_the_new_parameters():
    model = ov.Net()
    opt = dsopt.torch.Optimizer(model.parameters(), ov.ADAM)
    assert opt.overlap is False
    overlapping = dsopt.torch.Optimizer(ov.Net().parameters(), ov.ADAM, overlap=HOOKS)
    for o in (opt, overlapping):
        extra = torch.nn.Parameter(torch.zeros(3))
        o.add_param_group({"params": [extra]})
        assert o.dsopt.num_groups == 2
        (extra * torch.arange(3.0)).sum().backward()
        assert (extra.grad is None) == (o is overlapping and HOOKS)  # handed over by its hook
        o.step()
        assert extra[1] < 0 and extra[0] == 0  # Adam: the zero gradient's element stays
        o.close()


def test_without_hooks_it_warns_and_steps_the_same(monkeypatch):
    """The fallback of torch < 2.1 (forced here on newer torch): one
    warning naming the torch version, then .grad handed over in step()
    (and dropped), with the results of overlap=False; with G = 2 the
    accumulated .grad is one micro-batch's worth and the other contributes
    zeros, so the step uses the mean as with hooks."""
    monkeypatch.setattr(dsopt.torch._optimizer, "_has_post_accumulate_grad_hooks", lambda: False)
    model = ov.Net()
    with pytest.warns(RuntimeWarning, match="torch >= 2.1") as record:
        opt = dsopt.torch.Optimizer(model.parameters(), ov.ADAMW, overlap=True)
    assert len(record) == 1 and torch.__version__ in str(record[0].message)
    assert "same" in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no further warning while training
        ov.train(model, opt, 4)
    opt.close()
    want, _ = ov.run(ov.ADAMW, False)
    assert not ov.differences(list(model.parameters()), want)
    assert all(p.grad is None for p in model.parameters())  # dropped in step()

    for name in ("adam", "zero2"):
        config = accumulating(CONFIGS[name])
        got, _ = ov.run(config, True, micro_batches=2)
        want, _ = ov.run(config, False, micro_batches=2,
                         reference_config=ov.without_accumulation(config))
        assert not ov.differences(got, want), (name, ov.differences(got, want))


def needs_mpirun():
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip(f"mpi4py is not installed for {sys.executable}")


def test_two_ranks_one_handing_nothing_over_steps_as_reading_grad(tmp_path):
    """mpirun -np 2: the last rank runs no backward pass in some steps;
    every rank completes with dsopt_step(NULL) (no EMISMATCH), and the
    parameters match overlap=False bit for bit."""
    needs_mpirun()
    mpi_runner.mpirun(Path(ov.__file__), 2, tmp_path, ["silent_rank"], timeout=300)
    lines = (tmp_path / "rank0.txt").read_text().splitlines()
    assert "silent_rank OK 3" in lines, lines


def test_four_ranks_bit_identical_to_reading_grad(tmp_path):
    """mpirun -np 4: ZeRO stage 0, 1 and 2, Adam and AdamW with clipping,
    G = 1 and 2, each rank its own data (with torch < 2.1: the fallback)."""
    needs_mpirun()
    script = Path(ov.__file__)
    mpi_runner.mpirun(script, 4, tmp_path, ["overlap"], timeout=300)
    lines = (tmp_path / "rank0.txt").read_text().splitlines()
    assert "overlap OK 12" in lines, lines
