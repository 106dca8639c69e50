"""dsopt.torch with parameters whose storage changed after the optimizer
was made (``model.to(torch.device("cpu", 0))``, ``model.to(torch.bfloat16)``,
``.to(float64).to(float32)``, ``p.data = p.data.clone()``, another device):
before the first step and mid-run, for AdamW, 1-bit Adam and ZeRO-2, one
process and two ranks (``mpirun -np 2``, mpi_torch_param_moves.py, whose
module doc says what each change must give); what cannot be followed is a
clear error that writes nothing; state_dict, load_state_dict, deepcopy,
pickling and add_param_group follow the parameters first; overlap=True.

Run under AddressSanitizer by tests/sanitize/run_sanitizers.sh: a write
to storage the model left would be reported there.

Needs torch; `make test-torch` (torch 1.13) and `make test-frameworks`
(PyPI torch) run this file."""

import copy
import pickle
import shutil
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt.torch  # noqa: E402
import mpi_runner  # noqa: E402
import mpi_torch_param_moves as moves  # noqa: E402
from dsopt_testing import build_feature  # noqa: E402
from mpi_torch_param_moves import MID_RUN, STEPS, batch, make_model, make_opt, params_of, \
    train  # noqa: E402


@pytest.mark.parametrize("at", [0, MID_RUN], ids=["before_the_first_step", "mid_run"])
@pytest.mark.parametrize("name", moves.CHANGES)
@pytest.mark.parametrize("kind", moves.KINDS)
def test_change_goes_on_as_documented(kind, name, at):
    moves.check_change(kind, name, at)


def backward(model, step):
    x, y = batch(step, 0)
    dtype = next(model.parameters()).dtype
    torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()


def assert_refused(opt, model, match, tensors=None):
    """step() raises RuntimeError matching every string of ``match`` and
    writes no parameter (or none of ``tensors``)."""
    tensors = list(model.parameters()) if tensors is None else tensors
    before = [t.detach().clone() for t in tensors]
    with pytest.raises(RuntimeError) as error:
        opt.step()
    for text in match:
        assert text in str(error.value), str(error.value)
    assert not moves.differences([t.detach() for t in tensors], before)


@pytest.mark.parametrize("kind", moves.KINDS)
def test_new_storage_keeps_the_dsopt_optimizer_and_its_step_count(kind):
    model = make_model()
    opt = make_opt(kind, model)
    train(model, opt, MID_RUN)
    kept = opt.dsopt
    moves.change(model, "clone")
    train(model, opt, 1, first=MID_RUN)
    assert opt.dsopt is kept and opt.last_step_info.step == MID_RUN + 1
    opt.close()


@pytest.mark.parametrize("name", ["cpu0", "f64_f32"])
def test_a_model_moved_with_the_grad_it_keeps_needs_no_clear_grad_cache(name):
    """``.grad`` kept from step to step (``zero_grad(set_to_none=False)``):
    ``model.to(...)`` moves each one in place, under the same tensor
    object, with its parameter. Following the parameters drops the kept
    gradient descriptors, so the step reads the new storage (the old one
    is freed: under ASan a read of it is reported)."""
    results = []
    for move in (False, True):
        model = make_model()
        opt = make_opt("adamw", model)
        for step in range(STEPS):
            opt.zero_grad(set_to_none=False)
            backward(model, step)
            if move and step == MID_RUN:
                moves.change(model, name)
            opt.step()
        results.append(params_of(model))
        opt.close()
    assert not moves.differences(results[1], results[0])


@pytest.mark.parametrize("kind", ["adamw", "zero2"])
def test_a_cast_keeps_moments_and_steps_and_takes_masters_from_the_cast_values(kind):
    model = make_model()
    opt = make_opt(kind, model)
    train(model, opt, MID_RUN)
    keys = ("exp_avg", "exp_avg_sq", "step")
    before = {p: {k: opt.state[p][k].clone() for k in keys} for p in model.parameters()}
    model.to(torch.bfloat16)
    opt.state_dict()  # one process: follows the cast at once
    for p in model.parameters():
        state = opt.state[p]
        assert torch.equal(state["master"].reshape(-1), p.detach().float().reshape(-1))
        for key in keys:
            assert torch.equal(state[key], before[p][key]), key
    model.to(torch.float32)  # back to fp32: the masters go, the values stay the cast ones
    opt.state_dict()
    for p in model.parameters():
        assert "master" not in opt.state[p]
        assert torch.equal(opt.state[p]["exp_avg"], before[p]["exp_avg"])
    opt.close()


def test_an_unsupported_dtype_is_a_clear_error_and_the_run_goes_on_once_cast_back():
    model = make_model()
    opt = make_opt("adamw", model)
    train(model, opt, MID_RUN)
    opt.zero_grad()
    backward(model, MID_RUN)
    model.to(torch.float64)
    assert_refused(opt, model, ["parameter 0", "torch.float64", "Nothing was updated"])
    model.to(torch.float32)  # exact: float32 -> float64 -> float32
    opt.step()
    train(model, opt, STEPS - MID_RUN - 1, first=MID_RUN + 1)
    want, _ = moves.run("adamw")
    assert not moves.differences(params_of(model), want)
    opt.close()


@pytest.mark.parametrize("how", ["meta", "transposed"])
def test_a_parameter_dsopt_cannot_update_is_a_clear_error(how):
    """A parameter on another device than the others, or without
    contiguous storage: RuntimeError naming it, nothing written; once it
    is back, the run goes on."""
    model = make_model()
    opt = make_opt("adamw", model)
    train(model, opt, MID_RUN)
    opt.zero_grad()
    backward(model, MID_RUN)
    weight = model[2].weight
    if how == "meta":
        if not hasattr(torch.utils, "swap_tensors"):
            pytest.skip(f"torch {torch.__version__} cannot put one parameter on another "
                        f"device in place (torch.utils.swap_tensors, torch >= 2.3)")
        other = torch.nn.Parameter(weight.detach().to("meta"))
        torch.utils.swap_tensors(weight, other)  # weight on meta, other the CPU one
        match = ["parameter 2", "(param_groups[0], shape (4, 16))", "meta", "one device"]
        cpu = [other if p is weight else p for p in model.parameters()]
    else:
        kept = weight.data
        weight.data = weight.data.t().contiguous().t()
        match = ["parameter 2", "contiguous"]
        cpu = None
    assert_refused(opt, model, match, cpu)
    if how == "meta":
        torch.utils.swap_tensors(weight, other)
    else:
        weight.data = kept
    opt.step()
    train(model, opt, STEPS - MID_RUN - 1, first=MID_RUN + 1)
    want, _ = moves.run("adamw")
    assert not moves.differences(params_of(model), want)
    opt.close()


def test_a_parameter_of_another_size_starts_over_before_the_first_step_only():
    model = make_model()
    opt = make_opt("adamw", model)
    bias = model[2].bias
    bias.data = torch.zeros(5)  # before any update: the optimizer starts over
    bias.grad = torch.ones(5)
    opt.step()
    assert opt.state[bias]["exp_avg"].shape == (5,)
    bias.data = torch.zeros(6)
    bias.grad = torch.ones(6)
    assert_refused(opt, model, ["parameter 3", "now has 6 elements, 5 when", "Nothing was"])
    opt.close()


def test_state_dict_after_a_cast_holds_the_new_dtypes():
    """Saved after a cast (before the step that would follow it), the state
    dict loads into an optimizer over the cast model and the runs agree."""
    model = make_model()
    opt = make_opt("adamw", model)
    train(model, opt, MID_RUN)
    model.to(torch.bfloat16)
    saved = opt.state_dict()
    model2 = copy.deepcopy(model)
    opt2 = make_opt("adamw", model2)
    opt2.load_state_dict(saved)
    train(model, opt, STEPS - MID_RUN, first=MID_RUN)
    train(model2, opt2, STEPS - MID_RUN, first=MID_RUN)
    assert not moves.differences(params_of(model2), params_of(model))
    opt.close()
    opt2.close()


def test_load_state_dict_writes_the_storage_the_parameters_have_now():
    """16-bit parameters: the load writes the saved masters (rounded) into
    the parameters; after a move, into their new storage, not the old."""
    model = make_model(torch.bfloat16)
    opt = make_opt("adamw", model)
    train(model, opt, MID_RUN)
    saved, saved_params = opt.state_dict(), params_of(model)
    train(model, opt, 1, first=MID_RUN)
    old = [p.data for p in model.parameters()]
    old_values = [t.clone() for t in old]
    moves.change(model, "clone")
    opt.load_state_dict(saved)
    assert not moves.differences(params_of(model), saved_params)
    assert not moves.differences(old, old_values)
    opt.close()


def test_deepcopy_pickling_and_add_param_group_follow_the_parameters_first():
    model = make_model()
    opt = make_opt("adamw", model)
    train(model, opt, MID_RUN)
    model.to(torch.bfloat16)
    model_copy, opt_copy = copy.deepcopy((model, opt))
    model_pickled, opt_pickled = pickle.loads(pickle.dumps((model, opt)))
    for m, o in ((model, opt), (model_copy, opt_copy), (model_pickled, opt_pickled)):
        train(m, o, STEPS - MID_RUN, first=MID_RUN)
    assert not moves.differences(params_of(model_copy), params_of(model))
    assert not moves.differences(params_of(model_pickled), params_of(model))
    opt.close()
    # add_param_group after new storage: the old parameters go on as without it
    results = []
    for add in (False, True):
        model = make_model()
        opt = make_opt("adamw", model)
        train(model, opt, MID_RUN)
        if add:
            moves.change(model, "clone")
            opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(3))]})
        train(model, opt, STEPS - MID_RUN, first=MID_RUN)
        results.append(params_of(model))
        opt.close()
    assert not moves.differences(results[1], results[0])


# ---- overlap=True ----------------------------------------------------------------

HOOKS = dsopt.torch._optimizer._has_post_accumulate_grad_hooks()
needs_hooks = pytest.mark.skipif(
    not HOOKS, reason=f"torch {torch.__version__} has no register_post_accumulate_grad_hook "
    f"(torch >= 2.1): overlap=True reads .grad in step(), which follows the parameters as "
    f"without overlap")


def run_overlap(name, overlap, micro_batches=1):
    """AdamW over STEPS steps with change ``name`` after MID_RUN, each step
    ``micro_batches`` backward passes (overlap: of the unscaled loss, with
    "gradient_accumulation_steps"; else of the loss divided by their
    count)."""
    model = make_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # torch < 2.1: no hooks
        opt = make_opt("adamw", model, overlap=overlap,
                       gradient_accumulation_steps=micro_batches if overlap else None)
    for step in range(STEPS):
        if step == MID_RUN:
            moves.change(model, name, opt)
        opt.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(step, micro)
            dtype = next(model.parameters()).dtype
            loss = torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y)
            (loss if overlap else loss / micro_batches).backward()
        opt.step()
    opt.close()
    return params_of(model)


@needs_hooks
@pytest.mark.parametrize("name,micro_batches", [("clone", 1), ("cpu0", 2), ("bf16", 1),
                                                ("device", 2)])
def test_overlap_follows_the_parameters_as_reading_grad_does(name, micro_batches):
    """New storage is rebound at the first hand-over of the step; after a
    cast or a move to another device the hooks leave .grad to step(),
    which rebuilds and hands it over: bit for bit the parameters of
    overlap=False. (Two micro-batches of bf16 gradients would not agree
    anyway: autograd sums them in bf16, dsopt in fp32.)"""
    got = run_overlap(name, True, micro_batches)
    want = run_overlap(name, False, micro_batches)
    assert not moves.differences(got, want)


def _cast(model):
    model.to(torch.bfloat16)
    return ["was cast from torch.float32 to torch.bfloat16"]


def _resize(model):
    bias = model[2].bias
    n = bias.numel()
    bias.data = torch.zeros(n + 1)
    return ["parameter 3 (", f"changed size from {n} to {n + 1} elements"]


@needs_hooks
@pytest.mark.parametrize("change", [_cast, _resize], ids=["cast", "resize"])
def test_overlap_change_between_backward_and_step_is_a_clear_error(change):
    """The error names what changed (a cast, a size) and when to change it."""
    model = make_model()
    opt = make_opt("adamw", model, overlap=True)
    train(model, opt, MID_RUN)
    opt.zero_grad()
    backward(model, MID_RUN)  # hands every gradient over
    assert_refused(opt, model, change(model) + ["between backward and step()"])
    opt.close()


# ---- two ranks ---------------------------------------------------------------------

def test_two_ranks(tmp_path):
    """mpirun -np 2 (mpi_torch_param_moves.py): every change before the first
    step and mid-run for AdamW, 1-bit Adam (in its compressed stage) and
    ZeRO-2, each rank with its own data; state_dict() (not collective)
    refuses a cast it would have to rebuild for, and the next step follows
    it."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    mpi_runner.mpirun(Path(moves.__file__), 2, tmp_path, ["moves", "not_collective"],
                      timeout=300)
    lines = (tmp_path / "rank0.txt").read_text().splitlines()
    assert f"moves OK {len(moves.KINDS) * len(moves.CHANGES) * 2}" in lines, lines
