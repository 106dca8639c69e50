"""dsopt.torch.SGD, the class dsopt.torch makes from the registry's
description of "SGD", as a drop-in for torch.optim.SGD: the same
signature, defaults, groups and ValueErrors, the same updates (momentum,
dampening, Nesterov, L2 weight decay; fp32 and bf16 parameters), and
state dicts that move between the two both ways (``momentum_buffer``, no
``"step"``, as torch keeps it)."""

import inspect

import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

if "SGD" not in dsopt.algorithm_names():
    pytest.skip("this libdsopt's registry has no SGD algorithm (dsopt.algorithm_names() lacks "
                "it), so dsopt.torch has no SGD class", allow_module_level=True)

SETTINGS = {
    "plain": dict(lr=0.05),
    "momentum": dict(lr=0.05, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.9, dampening=0.3),
    "nesterov": dict(lr=0.05, momentum=0.8, nesterov=True),
    "weight_decay": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    "everything": dict(lr=0.02, momentum=0.7, weight_decay=0.05, nesterov=True),
}
SHAPES = ((6, 5), (130,), (3,))


def make_params(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in SHAPES]


def set_grads(params, step, dtype=None):
    gen = torch.Generator().manual_seed(1000 + step)
    for i, p in enumerate(params):
        p.grad = (torch.randn(p.shape, generator=gen) * (1 + i)).to(dtype or p.dtype)


def run(opt, params, steps, first=0, dtype=None):
    for step in range(first, first + steps):
        set_grads(params, step, dtype)
        opt.step()


def assert_close(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach().float(), b.detach().float(), rtol=1e-6, atol=1e-6)


# ---- the class -------------------------------------------------------------------------

def test_signature_and_defaults_are_torchs():
    ours = inspect.signature(dsopt.torch.SGD).parameters
    theirs = inspect.signature(torch.optim.SGD).parameters
    assert list(ours)[:len(theirs)] == list(theirs)
    for name, p in theirs.items():
        if name == "params" or repr(p.default) == "<required parameter>":  # torch 1.13's lr
            continue
        assert ours[name].default == p.default and ours[name].kind == p.kind, name
    assert ours["lr"].default == 1e-3 and ours["nesterov"].default is False
    assert "SGD" in dsopt.torch.__all__ and issubclass(dsopt.torch.SGD, dsopt.torch.Optimizer)


def test_groups_carry_torchs_keys_and_values():
    ours = dsopt.torch.SGD(make_params(), lr=0.1, momentum=0.9, nesterov=True)
    theirs = torch.optim.SGD(make_params(), lr=0.1, momentum=0.9, nesterov=True)
    for a, b in zip(ours.param_groups, theirs.param_groups):
        assert {k: v for k, v in a.items() if k != "params"} == \
            {k: v for k, v in b.items() if k != "params"}
    assert ours.param_groups[0]["nesterov"] is True


def torch_error(**kwargs):
    with pytest.raises(ValueError) as caught:
        torch.optim.SGD(make_params(), **kwargs)
    return str(caught.value)


@pytest.mark.parametrize("kwargs", [dict(lr=-0.1), dict(lr=0.1, momentum=-0.5),
                                    dict(lr=0.1, weight_decay=-1.0),
                                    dict(lr=0.1, nesterov=True),
                                    dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)],
                         ids=["lr", "momentum", "weight_decay", "nesterov_without_momentum",
                              "nesterov_with_dampening"])
def test_bad_values_are_torchs_value_errors(kwargs):
    message = torch_error(**kwargs)
    with pytest.raises(ValueError) as caught:
        dsopt.torch.SGD(make_params(), **kwargs)
    assert str(caught.value) == message


def test_nesterov_needs_momentum_and_zero_dampening():
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero "
                                         "dampening"):
        dsopt.torch.SGD(make_params(), lr=0.1, momentum=0.0, nesterov=True)


def test_unsupported_torch_flags_and_unknown_keywords():
    with pytest.raises(ValueError, match="maximize"):
        dsopt.torch.SGD(make_params(), maximize=True)
    with pytest.raises(TypeError):
        dsopt.torch.SGD(make_params(), betas=(0.9, 0.99))
    dsopt.torch.SGD(make_params(), foreach=False)  # accepted, as torch accepts it


# ---- the updates -----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SETTINGS))
def test_fp32_steps_match_torch(name):
    ours_p, ref_p = make_params(), make_params()
    ours = dsopt.torch.SGD(ours_p, **SETTINGS[name])
    ref = torch.optim.SGD(ref_p, **SETTINGS[name], foreach=False)
    for step in range(12):
        set_grads(ours_p, step)
        set_grads(ref_p, step)
        ours.step()
        ref.step()
        assert_close(ours_p, ref_p)


def test_groups_with_their_own_values_match_torch():
    def groups(params):
        return [{"params": params[:2]},
                {"params": params[2:], "lr": 0.01, "momentum": 0.5, "dampening": 0.2}]

    ours_p, ref_p = make_params(), make_params()
    ours = dsopt.torch.SGD(groups(ours_p), lr=0.05, momentum=0.9, weight_decay=0.01)
    ref = torch.optim.SGD(groups(ref_p), lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False)
    run(ours, ours_p, 5)
    run(ref, ref_p, 5)
    for opt in (ours, ref):  # a change between steps, as a scheduler makes
        opt.param_groups[0]["momentum"] = 0.6
        opt.param_groups[1]["lr"] = 0.02
    run(ours, ours_p, 5, first=5)
    run(ref, ref_p, 5, first=5)
    assert_close(ours_p, ref_p)


@pytest.mark.parametrize("name", ["momentum", "nesterov", "everything"])
def test_bf16_parameters_follow_fp32_masters_that_match_torch(name):
    """dsopt keeps fp32 masters and an fp32 momentum buffer for bf16
    parameters: the masters follow torch.optim.SGD's fp32 run on the same
    (bf16) gradients, and each parameter is its master rounded to bf16."""
    ours_p = make_params(torch.bfloat16)
    ref_p = [torch.nn.Parameter(p.detach().float()) for p in ours_p]
    ours = dsopt.torch.SGD(ours_p, **SETTINGS[name])
    ref = torch.optim.SGD(ref_p, **SETTINGS[name], foreach=False)
    for step in range(10):
        set_grads(ours_p, step)
        for p, q in zip(ref_p, ours_p):
            p.grad = q.grad.float()
        ours.step()
        ref.step()
    masters = [ours.state[p]["master"].reshape(p.shape) for p in ours_p]
    assert_close(masters, ref_p)
    for p, m in zip(ours_p, masters):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))
    # against torch's own bf16 run too, within bf16's resolution
    bf16_p = make_params(torch.bfloat16)
    bf16 = torch.optim.SGD(bf16_p, **SETTINGS[name], foreach=False)
    run(bf16, bf16_p, 10)
    for a, b in zip(ours_p, bf16_p):
        torch.testing.assert_close(a.detach().float(), b.detach().float(), rtol=0.05, atol=0.05)


# ---- state -----------------------------------------------------------------------------

def test_state_is_the_momentum_buffer():
    params = make_params()
    opt = dsopt.torch.SGD(params, lr=0.05, momentum=0.9)
    ref_p = make_params()
    ref = torch.optim.SGD(ref_p, lr=0.05, momentum=0.9, foreach=False)
    run(opt, params, 3)
    run(ref, ref_p, 3)
    for p, q in zip(params, ref_p):
        assert "momentum_buffer" in opt.state[p]
        torch.testing.assert_close(opt.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"])


def test_torch_state_dict_loads_into_torch_sgd_and_continues():
    ours_p = make_params()
    ours = dsopt.torch.SGD(ours_p, lr=0.05, momentum=0.9, nesterov=True)
    run(ours, ours_p, 4)
    saved = ours.torch_state_dict()
    ref_p = [torch.nn.Parameter(p.detach().clone()) for p in ours_p]
    ref = torch.optim.SGD(ref_p, lr=0.05, momentum=0.9, nesterov=True, foreach=False)
    theirs = ref.state_dict()
    assert set(saved["param_groups"][0]) == set(theirs["param_groups"][0])
    assert all(set(entry) == {"momentum_buffer"} for entry in saved["state"].values())
    ref.load_state_dict(saved)
    run(ours, ours_p, 4, first=4)
    run(ref, ref_p, 4, first=4)
    assert_close(ours_p, ref_p)


def test_load_state_dict_of_torch_sgd_continues_its_run():
    ref_p = make_params()
    ref = torch.optim.SGD(ref_p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01,
                          foreach=False)
    run(ref, ref_p, 4)
    ours_p = [torch.nn.Parameter(p.detach().clone()) for p in ref_p]
    ours = dsopt.torch.SGD(ours_p, lr=0.5)
    ours.load_state_dict(ref.state_dict())
    assert ours.param_groups[0]["lr"] == 0.05 and ours.param_groups[0]["dampening"] == 0.1
    assert all(ours.dsopt.param_step(i) > 0 for i in range(len(ours_p)))
    run(ours, ours_p, 5, first=4)
    run(ref, ref_p, 5, first=4)
    assert_close(ours_p, ref_p)


def test_load_state_dict_without_momentum_has_no_buffers_to_load():
    ref_p = make_params()
    ref = torch.optim.SGD(ref_p, lr=0.05, foreach=False)
    run(ref, ref_p, 2)
    ours_p = [torch.nn.Parameter(p.detach().clone()) for p in ref_p]
    ours = dsopt.torch.SGD(ours_p, lr=0.05)
    ours.load_state_dict(ref.state_dict())
    run(ours, ours_p, 3, first=2)
    run(ref, ref_p, 3, first=2)
    assert_close(ours_p, ref_p)


def test_dsopt_state_dict_round_trip_continues_identically():
    params = make_params()
    opt = dsopt.torch.SGD(params, lr=0.05, momentum=0.9)
    run(opt, params, 3)
    saved = opt.state_dict()
    twin_p = [torch.nn.Parameter(p.detach().clone()) for p in params]
    twin = dsopt.torch.SGD(twin_p, lr=0.05, momentum=0.9)
    twin.load_state_dict(saved)
    run(opt, params, 3, first=3)
    run(twin, twin_p, 3, first=3)
    for a, b in zip(params, twin_p):
        assert torch.equal(a, b)


def test_add_param_group_after_the_first_step_matches_torch():
    """SGD counts steps per parameter, so a group added mid-run starts
    fresh (its first step takes the gradient as the buffer) while the
    others go on, as torch.optim.SGD's add_param_group does."""
    ours_p, ref_p = make_params(), make_params()
    ours = dsopt.torch.SGD(ours_p[:2], lr=0.05, momentum=0.9)
    ref = torch.optim.SGD(ref_p[:2], lr=0.05, momentum=0.9, foreach=False)
    run(ours, ours_p[:2], 3)
    run(ref, ref_p[:2], 3)
    ours.add_param_group({"params": ours_p[2:], "lr": 0.02})
    ref.add_param_group({"params": ref_p[2:], "lr": 0.02})
    run(ours, ours_p, 4, first=3)
    run(ref, ref_p, 4, first=3)
    assert_close(ours_p, ref_p)
