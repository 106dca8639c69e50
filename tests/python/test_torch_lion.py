"""dsopt.torch.Lion against a float64 Lion written in torch (the paper's
reference code's update) and against lion_reference.py: torch-style
arguments and groups (lr, betas, weight_decay; no eps), the state
(exp_avg alone), state_dict round trips, lr schedulers and ZeRO."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt.torch  # noqa: E402
from lion_reference import LionReference  # noqa: E402


class TorchLion:
    """The paper's reference update in float64 torch, with the sign
    decided on c formed in fp32 (lion_reference.py explains why)."""

    def __init__(self, params, lr, betas, weight_decay):
        self.p = [p.detach().double().clone() for p in params]
        self.m = [torch.zeros_like(p, dtype=torch.float32) for p in params]
        self.lr, self.betas, self.wd = lr, betas, weight_decay

    def step(self, grads):
        b1, b2 = np.float32(self.betas[0]), np.float32(self.betas[1])
        lr = float(np.float32(self.lr))
        decay = float(np.float32(-np.float32(self.lr) * np.float32(self.wd)))
        for i, g in enumerate(grads):
            g = g.float()
            c = (g.double() * float(np.float32(1) - b1) + (self.m[i] * float(b1)).double()).float()
            self.p[i] = self.p[i] + self.p[i] * decay - lr * torch.sign(c).double()
            self.m[i] = (g.double() * float(np.float32(1) - b2) + (self.m[i] * float(b2)).double()).float()


def model(seed=0):
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n)) for n in (7, 1000, 33)]


def grads_for(params, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen) * (1 + i) for i, p in enumerate(params)]


def train(opt, params, steps, sched=None):
    for k in range(steps):
        for p, g in zip(params, grads_for(params, k)):
            p.grad = g.clone()
        opt.step()
        if sched is not None:
            sched.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_matches_the_reference_update(weight_decay):
    params = model()
    ref = TorchLion(params, 3e-3, (0.9, 0.99), weight_decay)
    numpy_ref = LionReference([p.detach().numpy() for p in params],
                              [{"lr": 3e-3, "betas": [0.9, 0.99], "weight_decay": weight_decay}])
    opt = dsopt.torch.Lion(params, lr=3e-3, weight_decay=weight_decay)
    for k in range(20):
        grads = grads_for(params, k)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        ref.step(grads)
        numpy_ref.step([g.numpy() for g in grads])
    for i, p in enumerate(params):
        torch.testing.assert_close(p.detach().double(), ref.p[i], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(p.detach().numpy(), numpy_ref.p[i], rtol=1e-5, atol=1e-6)
        assert torch.equal(opt.state[p]["exp_avg"], ref.m[i])
    assert set(opt.state[params[0]]) >= {"exp_avg"} and "exp_avg_sq" not in opt.state[params[0]]


def test_torch_style_arguments_and_groups():
    params = model()
    opt = dsopt.torch.Lion([{"params": params[:2]}, {"params": params[2:], "lr": 1e-3, "betas": (0.8, 0.9)}])
    assert opt.defaults["lr"] == 1e-4 and opt.defaults["betas"] == (0.9, 0.99)
    assert opt.defaults["weight_decay"] == 0.0 and "eps" not in opt.defaults
    assert "eps" not in opt.param_groups[0] and opt.param_groups[1]["betas"] == (0.8, 0.9)
    assert opt.dsopt.config["optimizer"] == {"type": "Lion", "params": {
        "lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0}}
    with pytest.raises(ValueError, match="Invalid learning rate"):
        dsopt.torch.Lion(model(), lr=-1.0)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        dsopt.torch.Lion(model(), betas=(0.9, 1.0))
    with pytest.raises(TypeError):
        dsopt.torch.Lion(model(), eps=1e-8)


def test_lr_scheduler_and_group_changes_reach_dsopt():
    params = model()
    opt = dsopt.torch.Lion(params, lr=1e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    train(opt, params, 5, sched)
    assert opt.dsopt.get_group_param(0, "lr") == pytest.approx(opt.param_groups[0]["lr"])
    opt.param_groups[0]["betas"] = (0.5, 0.6)
    opt.param_groups[0]["weight_decay"] = 0.2
    train(opt, params, 1)
    assert opt.dsopt.get_group_param(0, "beta1") == pytest.approx(0.5)
    assert opt.dsopt.get_group_param(0, "weight_decay") == pytest.approx(0.2)


def test_state_dict_round_trip_continues_identically():
    a_params, b_params = model(), model()
    a = dsopt.torch.Lion(a_params, lr=1e-3, weight_decay=0.1)
    train(a, a_params, 4)
    saved = a.state_dict()
    b = dsopt.torch.Lion(b_params, lr=1e-3, weight_decay=0.1)
    with torch.no_grad():
        for x, y in zip(b_params, a_params):
            x.copy_(y)
    b.load_state_dict(saved)
    for opt, params in ((a, a_params), (b, b_params)):
        for k in range(4, 7):
            for p, g in zip(params, grads_for(params, k)):
                p.grad = g.clone()
            opt.step()
    for x, y in zip(a_params, b_params):
        assert torch.equal(x, y)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_stage_equals_stage_0(stage):
    plain, sharded = model(), model()
    train(dsopt.torch.Lion(plain, lr=1e-3), plain, 5)
    train(dsopt.torch.Lion(sharded, lr=1e-3, zero_stage=stage), sharded, 5)
    for x, y in zip(plain, sharded):
        assert torch.equal(x, y)


# ---- add_param_group after the first step (Lion counts steps per parameter) ----------

def test_add_param_group_after_the_first_step_continues_as_if_the_group_had_been_there():
    """Lion leaves a parameter without a gradient alone and counts steps
    per parameter (dsopt.describe("Lion").param_steps), so a group added
    after the first step gives the same bits as one present from the start
    whose .grad stayed None until then; the old parameters' moments, steps
    and changed hyperparameters carry over."""
    assert dsopt.describe("Lion").param_steps

    def run(add_later):
        params = model()
        body, head = params[:2], params[2:]
        if add_later:
            opt = dsopt.torch.Lion(body, lr=0.01)
        else:
            opt = dsopt.torch.Lion([{"params": body}, {"params": head, "lr": 0.03,
                                                       "betas": (0.8, 0.9)}], lr=0.01)
        carried = None
        for step in range(8):
            if step == 4:
                opt.param_groups[0]["lr"] = 0.02
                if add_later:
                    before = [opt.state[p]["exp_avg"].clone() for p in body]
                    opt.add_param_group({"params": head, "lr": 0.03, "betas": (0.8, 0.9)})
                    carried = [opt.state[p]["exp_avg"] for p in body]
                    assert all(torch.equal(a, b) for a, b in zip(before, carried))
                    assert head[0] not in opt.state  # the new parameter starts fresh
            for i, (p, g) in enumerate(zip(params, grads_for(params, step))):
                p.grad = None if (p is head[0] and step < 4) else g
            opt.step()
        return params, opt

    got, opt = run(True)
    want, ref = run(False)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert [opt.dsopt.param_step(i) for i in range(3)] == [8, 8, 4]
    assert opt.param_groups[1]["betas"] == (0.8, 0.9) and "eps" not in opt.param_groups[1]
    assert opt.dsopt.get_group_param(0, "lr") == pytest.approx(0.02)
    saved = opt.state_dict()
    ref.load_state_dict(saved)
    assert ref.state_dict()["dsopt_state"] == saved["dsopt_state"]


def test_add_param_group_carries_fp32_masters_of_16_bit_parameters():
    def run(add_later):
        gen = torch.Generator().manual_seed(0)
        a = torch.nn.Parameter(torch.randn(20, generator=gen).to(torch.bfloat16))
        b = torch.nn.Parameter(torch.randn(5, generator=gen).to(torch.bfloat16))
        opt = dsopt.torch.Lion([a] if add_later else [a, b], lr=0.01, weight_decay=0.1)
        for step in range(6):
            if step == 3 and add_later:
                opt.add_param_group({"params": [b]})
            gen = torch.Generator().manual_seed(10 + step)
            a.grad = torch.randn(20, generator=gen).to(torch.bfloat16)
            b.grad = torch.randn(5, generator=gen).to(torch.bfloat16) if step >= 3 else None
            opt.step()
        return [a, b]

    for got, want in zip(run(True), run(False)):
        assert torch.equal(got, want)
