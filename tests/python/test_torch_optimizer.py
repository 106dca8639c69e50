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


def test_parameter_without_grad_is_left_alone():
    """.grad None is an absent gradient: Adam does not touch the parameter
    and does not count the step for it (torch.optim's rule)."""
    model = make_model()
    before = snapshot(model)
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    opt.zero_grad(set_to_none=True)
    opt.step()
    assert opt.last_step_info.step == 1
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)
    assert opt.dsopt.param_step(0) == 0 and len(opt.state) == 0


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


def test_state_dict_saves_hyperparameters_changed_after_the_last_step():
    model = make_model()
    opt = dsopt.torch.Optimizer(model.parameters(), ADAM)
    train(model, opt, 1)
    opt.param_groups[0]["lr"] = 0.25  # a scheduler stepped after opt.step()
    opt.param_groups[0]["betas"] = (0.5, 0.75)
    blob = opt.state_dict()["dsopt_state"]
    assert opt.dsopt.get_group_param(0, "lr") == 0.25
    assert opt.dsopt.get_group_param(0, "beta2") == 0.75
    other = dsopt.torch.Optimizer(make_model().parameters(), ADAM)
    other.dsopt.load_state_dict(blob)
    assert other.dsopt.get_group_param(0, "lr") == 0.25
    other.close()
    opt.close()


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


def test_parameters_sharing_storage_are_rejected_naming_both():
    """Two parameters that are overlapping views of one tensor would both be
    updated on every step: refused by the library, named in the error."""
    base = torch.zeros(30)
    first, second = torch.nn.Parameter(base[:20]), torch.nn.Parameter(base[10:])
    with pytest.raises(dsopt.InvalidArgument, match=r"params\[0\] and params\[1\] share storage"):
        dsopt.torch.Optimizer([first, second], ADAM)
    dsopt.torch.Optimizer([torch.nn.Parameter(base[:10]), torch.nn.Parameter(base[10:])], ADAM)  # adjacent


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


# ---- ZeRO stage 2 (one process; the shard is the whole model) ------------------

ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}
# Small buckets: the reduce-scatter and the allgather run in several pieces
# that split the model's tensors.
ZERO2 = dict(ADAMW, zero_optimization={"stage": 2, "reduce_bucket_size": 40,
                                       "allgather_bucket_size": 24})


def two_groups(model, lr=0.02):
    return [{"params": model[0].parameters()},
            {"params": model[2].parameters(), "lr": lr, "weight_decay": 0.0}]


def assert_models_equal(a, b):
    for x, y in zip(a.parameters(), b.parameters()):
        assert torch.equal(x, y)


def test_zero_stage_2_trains_bit_identically_to_stage_0_on_one_rank():
    plain, sharded = make_model(), make_model()
    losses0 = train(plain, dsopt.torch.Optimizer(two_groups(plain), ADAMW), 12)
    opt = dsopt.torch.Optimizer(two_groups(sharded), ZERO2)
    losses2 = train(sharded, opt, 12)
    assert losses2 == losses0
    assert_models_equal(sharded, plain)
    assert opt.last_step_info.step == 12
    usage = opt.memory_usage()
    n = sum(p.numel() for p in sharded.parameters())
    assert usage["host"] >= 8 * n and usage["device"] == 0, usage  # at least both moments


def test_zero_stage_2_state_dict_round_trip_resumes_bit_identically():
    straight = make_model()
    train(straight, dsopt.torch.Optimizer(two_groups(straight), ZERO2), 6)

    model = make_model()
    opt = dsopt.torch.Optimizer(two_groups(model), ZERO2)
    train(model, opt, 3)
    saved_model, saved_opt = model.state_dict(), opt.state_dict()
    opt.close()

    resumed = make_model(seed=1)
    resumed.load_state_dict(saved_model)
    opt = dsopt.torch.Optimizer(two_groups(resumed), ZERO2)
    opt.load_state_dict(saved_opt)
    train(resumed, opt, 3, first=3)
    assert_models_equal(resumed, straight)


@pytest.mark.parametrize("saved_config,loaded_config", [(ZERO2, ZERO2), (ADAMW, ZERO2),
                                                        (ZERO2, ADAMW)],
                         ids=["stage2_to_stage2", "stage0_to_stage2", "stage2_to_stage0"])
def test_load_state_dict_shards_continues_the_saved_run(saved_config, loaded_config):
    straight = make_model()
    train(straight, dsopt.torch.Optimizer(two_groups(straight), ADAMW), 6)

    model = make_model()
    opt = dsopt.torch.Optimizer(two_groups(model, lr=0.03), saved_config)
    opt.param_groups[1]["lr"] = 0.02  # restored from the state dicts below
    train(model, opt, 3)
    saved_model, state_dicts = model.state_dict(), [opt.state_dict()]  # every rank's: one here
    opt.close()

    resumed = make_model(seed=1)
    resumed.load_state_dict(saved_model)
    opt = dsopt.torch.Optimizer(two_groups(resumed, lr=0.5), loaded_config)
    opt.load_state_dict_shards(state_dicts)
    assert opt.param_groups[1]["lr"] == 0.02
    assert opt.dsopt.get_group_lr(1) == pytest.approx(0.02)
    train(resumed, opt, 3, first=3)
    assert opt.last_step_info.step == 6
    assert_models_equal(resumed, straight)


def test_load_state_dict_shards_rejects_bad_lists_and_changes_nothing():
    model = make_model()
    opt = dsopt.torch.Optimizer(two_groups(model), ZERO2)
    train(model, opt, 2)
    saved = opt.state_dict()
    other = make_model()
    onebit = dsopt.torch.Optimizer(
        two_groups(other), {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}})
    train(other, onebit, 1)
    damaged = dict(saved, dsopt_state=saved["dsopt_state"][:-1] + bytes(
        [saved["dsopt_state"][-1] ^ 0x5A]))
    fewer_groups = dict(saved, param_groups=saved["param_groups"][:1])

    fresh_model = make_model(seed=1)
    fresh = dsopt.torch.Optimizer(two_groups(fresh_model, lr=0.5), ZERO2)
    before = fresh.state_dict()
    with pytest.raises(ValueError, match="at least one"):
        fresh.load_state_dict_shards([])
    with pytest.raises(TypeError, match="list of state dicts"):
        fresh.load_state_dict_shards(saved)
    with pytest.raises(ValueError, match="dsopt_state"):
        fresh.load_state_dict_shards([{"state": {}, "param_groups": []}])
    with pytest.raises(ValueError, match="parameter groups"):
        fresh.load_state_dict_shards([fewer_groups])
    with pytest.raises(dsopt.CorruptState):
        fresh.load_state_dict_shards([damaged])
    with pytest.raises(dsopt.Mismatch, match="1 ranks"):
        fresh.load_state_dict_shards([saved, saved])  # a one-rank run wrote one
    with pytest.raises(dsopt.Mismatch):
        fresh.load_state_dict_shards([onebit.state_dict()])
    assert fresh.state_dict() == before
    assert [g["lr"] for g in fresh.param_groups] == [0.01, 0.5]

    fresh.load_state_dict_shards([saved])
    assert fresh.state_dict()["dsopt_state"] == saved["dsopt_state"]


TORCH_CLASSES = ("Adam", "AdamW", "Lamb", "OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Lion")
# Each algorithm's group hyperparameters as docs/reference/config.md lists
# them (written out here, not read from dsopt).
GROUP_HYPER_KEYS = dict({t: {"lr", "betas", "eps", "weight_decay"} for t in TORCH_CLASSES},
                        Lion={"lr", "betas", "weight_decay"})


@pytest.mark.parametrize("name", sorted(TORCH_CLASSES))
def test_groups_carry_exactly_the_algorithms_hyperparameters(name):
    """Groups have the algorithm's hyperparameters (dsopt's list; Lion no
    eps), none other; each change reaches dsopt before the next step, and a
    state dict round trip restores them."""
    model = make_model()
    params = list(model.parameters())
    cls = getattr(dsopt.torch, name)
    opt = cls([{"params": params[:2]}, {"params": params[2:], "lr": 0.002}], lr=0.01)
    hyper = {key for _, key in dsopt.group_params(name)}
    assert hyper == GROUP_HYPER_KEYS[name]
    for group in opt.param_groups:
        assert {"lr", "betas", "eps", "weight_decay"} & set(group) == hyper
        assert hyper <= set(opt.defaults)
    assert opt.param_groups[1]["lr"] == 0.002 and isinstance(opt.param_groups[1]["betas"], tuple)
    train(model, opt, 2)
    opt.param_groups[1]["betas"] = (0.5, 0.75)
    opt.param_groups[0]["weight_decay"] = 0.125
    train(model, opt, 1, first=2)
    assert opt.dsopt.get_group_param(1, "beta1") == 0.5
    assert opt.dsopt.get_group_param(1, "beta2") == 0.75
    assert opt.dsopt.get_group_param(0, "weight_decay") == 0.125
    saved = opt.state_dict()
    model2 = make_model(seed=1)
    params2 = list(model2.parameters())
    opt2 = cls([{"params": params2[:2]}, {"params": params2[2:], "lr": 0.002}], lr=0.01)
    opt2.load_state_dict(saved)
    assert opt2.param_groups[1]["betas"] == (0.5, 0.75)
    assert opt2.dsopt.get_group_param(1, "beta2") == 0.75
    assert opt2.dsopt.get_group_param(0, "weight_decay") == 0.125
    assert {"lr", "betas", "eps", "weight_decay"} & set(opt2.param_groups[0]) == hyper
    opt.param_groups[1]["betas"] = (0.5, 1.0)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        opt.step()
