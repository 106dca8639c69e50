"""dsopt.torch.Optimizer: a drop-in torch.optim.Optimizer running dsopt.

Needs torch; `make test-torch` runs this file with a Python that has it
(Debian's python3-torch under /usr/bin/python3 on the CI machine)."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 0.01}}}


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=gen)
    y = 0.3 * (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:].sum(dim=1, keepdim=True))
    return x, y


def train(model, opt, steps, first=0, scheduler=None):
    losses = []
    for step in range(first, first + steps):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss))
    return losses


def snapshot(model):
    return [p.detach().clone() for p in model.parameters()]


def test_is_a_torch_optimizer_and_trains():
    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    assert isinstance(opt, torch.optim.Optimizer)
    losses = train(model, opt, 60)
    assert losses[-1] < 0.5 * losses[0]
    assert opt.last_step_info.step == 60


def test_matches_torch_adam_within_fp32_rounding():
    ours, theirs = make_model(), make_model()
    train(ours, dsopt.torch.Optimizer(ours.parameters(), ADAM), 10)
    train(theirs, torch.optim.Adam(theirs.parameters(), lr=0.01), 10)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_steps_bit_identically_to_dsopt_on_numpy_arrays():
    model = make_model()
    arrays = [p.detach().numpy().copy() for p in model.parameters()]
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    with dsopt.Optimizer(ADAM, arrays) as reference:
        for step in range(5):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            reference.step([p.grad.numpy().copy() for p in model.parameters()])
            opt.step()
    for p, a in zip(model.parameters(), arrays):
        np.testing.assert_array_equal(p.detach().numpy(), a)


def test_lr_scheduler_changes_reach_dsopt_before_the_next_step():
    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    train(model, opt, 3, scheduler=scheduler)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01 / 8)
    assert opt.dsopt.get_group_lr(0) == pytest.approx(0.01 / 4)  # handed over at the next step
    train(model, opt, 1)
    assert opt.dsopt.get_group_lr(0) == pytest.approx(0.01 / 8)


def test_parameter_groups_become_dsopt_groups():
    model = make_model()
    first, last = model[0], model[2]
    opt = dsopt.torch.Optimizer(
        [
            {"params": first.parameters()},
            {"params": last.parameters(), "lr": 0.1, "weight_decay": 0.01},
        ],
        ADAM,
    )
    assert opt.dsopt.num_groups == 2
    assert [opt.dsopt.get_group_lr(g) for g in range(2)] == pytest.approx([0.01, 0.1])


def test_group_setting_dsopt_does_not_know_is_an_error_naming_it():
    model = make_model()
    with pytest.raises(dsopt.InvalidArgument, match="momentum"):
        dsopt.torch.Optimizer([{"params": model.parameters(), "momentum": 0.9}], ADAM)


def test_config_with_its_own_param_groups_is_rejected():
    with pytest.raises(ValueError, match="param_groups"):
        dsopt.torch.Optimizer(make_model().parameters(), dict(ADAM, param_groups=[{}]))


def test_parameter_without_grad_steps_with_a_zero_gradient():
    model = make_model()
    before = snapshot(model)
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    opt.zero_grad(set_to_none=True)
    opt.step()
    assert opt.last_step_info.step == 1
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)  # Adam moves nothing on a zero first gradient


def test_state_dict_round_trip_resumes_bit_identically():
    straight = make_model()
    train(straight, dsopt.torch.Optimizer(straight.parameters(), ADAM), 6)

    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    train(model, opt, 3)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    assert isinstance(saved_opt["dsopt_state"], bytes)
    opt.close()

    resumed = make_model(seed=1)
    resumed.load_state_dict(saved_model)
    opt = dsopt.torch.Optimizer(resumed.parameters(), ADAM)
    opt.load_state_dict(saved_opt)
    train(resumed, opt, 3, first=3)
    for a, b in zip(resumed.parameters(), straight.parameters()):
        assert torch.equal(a, b)


def test_load_state_dict_restores_changed_learning_rates():
    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    opt.param_groups[0]["lr"] = 0.003
    train(model, opt, 1)
    saved = opt.state_dict()
    fresh = dsopt.torch.Optimizer(model.parameters(), ADAM)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.003
    assert fresh.dsopt.get_group_lr(0) == pytest.approx(0.003)


def test_one_bit_adam_compresses_after_freeze_step():
    model = make_model()
    config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}}}
    opt = dsopt.torch.Optimizer(model.parameters(), config)
    compressed = []
    for step in range(5):
        train(model, opt, 1, first=step)
        compressed.append(opt.last_step_info.compressed)
    assert compressed == [False, False, True, True, True]


def test_one_bit_lamb_trains_and_compresses_after_freeze_step():
    """Only "type" changes; a parameter without .grad steps with zeros (L2)."""
    model = make_model()
    config = {"optimizer": {"type": "OneBitLamb", "params": {"lr": 0.05, "freeze_step": 10}}}
    opt = dsopt.torch.Optimizer(model.parameters(), config)
    losses = train(model, opt, 60)
    assert losses[-1] < 0.5 * losses[0]
    assert opt.last_step_info.compressed and opt.last_step_info.step == 60


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parameters_train_on_fp32_masters(dtype):
    # (torch's CPU kernels lack most 16-bit ops: the loss is computed in fp32.)
    target = torch.linspace(-1, 1, 64)
    param = torch.nn.Parameter(torch.zeros(64, dtype=dtype))
    opt = dsopt.torch.Optimizer([param], {"optimizer": {"type": "AdamW", "params": {"lr": 0.05}}})
    losses = []
    for _ in range(40):
        opt.zero_grad()
        loss = ((param.float() - target) ** 2).mean()
        loss.backward()
        assert param.grad.dtype == dtype
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.1 * losses[0]
    assert param.dtype == dtype


def test_non_contiguous_parameter_is_rejected():
    weight = torch.nn.Parameter(torch.zeros(4, 6).t())
    with pytest.raises(dsopt.InvalidArgument, match="contiguous"):
        dsopt.torch.Optimizer([weight], ADAM)


def test_skipped_steps_warn_and_a_stalled_run_raises_non_finite_error():
    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), dict(ADAM, max_consecutive_skips=2))
    train(model, opt, 1)
    before = snapshot(model)

    def nan_step():
        x, y = batch(0)
        opt.zero_grad()
        (torch.nn.functional.mse_loss(model(x), y) * float("nan")).backward()
        opt.step()

    with pytest.warns(dsopt.SkippedStepWarning, match="1 skipped in a row"):
        nan_step()
    assert opt.last_step_info.skipped and opt.last_step_info.consecutive_skips == 1
    with pytest.raises(dsopt.NonFiniteError, match="max_consecutive_skips") as excinfo:
        nan_step()
    assert excinfo.value.info is opt.last_step_info
    assert opt.last_step_info.consecutive_skips == 2 and opt.last_step_info.step == 1
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)
    train(model, opt, 1)  # the run may continue
    assert opt.last_step_info.step == 2 and opt.last_step_info.consecutive_skips == 0
