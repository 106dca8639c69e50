"""dsopt.torch.Adam / AdamW / Lamb / OneBitAdam / OneBitLamb / ZeroOneAdam as
drop-in torch.optim optimizers: signatures, defaults and errors; .grad
None (frozen parameters, unused branches) as torch.optim treats it;
group hyperparameters that change mid-run; optimizer.state as a live view
of dsopt's state; moving a run between torch.optim and dsopt both ways;
add_param_group after creation; copy.deepcopy; zero_grad and closures.

Needs torch; `make test-torch` runs this file with a Python that has it
(torch 1.13 under Debian's /usr/bin/python3; torch 2.x works too)."""

import copy
import inspect
import io
import pickle
import warnings

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch",
    reason="torch is not installed for this Python; `make test-torch` runs these tests "
    "with a Python that has it (e.g. Debian's python3-torch under /usr/bin/python3)",
)

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

CLASSES = [dsopt.torch.Adam, dsopt.torch.AdamW, dsopt.torch.Lamb, dsopt.torch.OneBitAdam,
           dsopt.torch.OneBitLamb, dsopt.torch.ZeroOneAdam]
PAIRS = {"Adam": (dsopt.torch.Adam, torch.optim.Adam),
         "AdamW": (dsopt.torch.AdamW, torch.optim.AdamW)}
# dsopt's fp32 Adam and torch's round differently in the last bits.
TOL = dict(rtol=1e-4, atol=1e-6)


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(step):
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 8, generator=gen)
    return x, 0.3 * x[:, :4].sum(dim=1, keepdim=True) - 0.2 * x[:, 4:].sum(dim=1, keepdim=True)


def train(model, opt, steps, first=0, set_to_none=True):
    for step in range(first, first + steps):
        x, y = batch(step)
        opt.zero_grad(set_to_none=set_to_none)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def assert_close(got, want, **tol):
    for a, b in zip(got, want):
        torch.testing.assert_close(a.detach(), b.detach(), **(tol or TOL))


def assert_equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert torch.equal(a.detach(), b.detach())


def one_param():
    return [torch.nn.Parameter(torch.ones(4))]


# ---- classes, signatures, defaults, errors ---------------------------------------

@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_signature_and_defaults_are_torch_optims(name):
    ours, theirs = PAIRS[name]
    our_params = inspect.signature(ours.__init__).parameters
    for pname, param in inspect.signature(theirs.__init__).parameters.items():
        assert pname in our_params, pname
        assert our_params[pname].default == param.default, pname
        assert our_params[pname].kind == param.kind, pname
    model = make_model()
    opt, ref = ours(model.parameters()), theirs(make_model().parameters())
    assert isinstance(opt, torch.optim.Optimizer) and isinstance(opt, dsopt.torch.Optimizer)
    group, ref_group = opt.param_groups[0], ref.param_groups[0]
    assert set(ref_group) <= set(group)  # every key torch's groups have
    for key in ref_group:
        if key != "params":
            assert group[key] == ref_group[key], key
    assert set(ref.defaults) <= set(opt.defaults)
    lr, beta1, beta2, eps, weight_decay = (opt.dsopt.get_group_param(0, n)
                                           for n in dsopt.Optimizer.GROUP_PARAMS)
    assert (lr, beta1, beta2, eps) == (1e-3, 0.9, 0.999, 1e-8)
    assert weight_decay == (0.01 if name == "AdamW" else 0.0)
    assert opt._config["optimizer"]["type"] == name
    assert opt._config["optimizer"]["params"].get("adam_w_mode", True) is (name == "AdamW")


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_trains_and_carries_torch_group_keys(cls):
    model = make_model()
    opt = cls(model.parameters(), lr=0.01)
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
                "capturable", "differentiable", "fused"):
        assert key in opt.param_groups[0], key
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    before = params_of(model)
    train(model, opt, 3)
    assert opt.last_step_info.step == 3
    assert not any(torch.equal(a, b) for a, b in zip(params_of(model), before))
    assert cls.__doc__ and "gradient_clipping" in cls.__doc__


@pytest.mark.parametrize("flag", ["amsgrad", "maximize", "capturable", "differentiable"])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_unsupported_torch_flags_raise_value_error_naming_them(name, flag):
    with pytest.raises(ValueError, match=f"{flag}=True: dsopt does not support"):
        PAIRS[name][0](one_param(), **{flag: True})
    with pytest.raises(ValueError, match=flag):
        PAIRS[name][0]([{"params": one_param(), flag: True}])


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_foreach_and_fused_are_accepted_and_kept(name):
    opt = PAIRS[name][0](one_param(), foreach=True, fused=False)
    assert opt.param_groups[0]["foreach"] is True and opt.param_groups[0]["fused"] is False


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_unknown_keyword_is_a_type_error_naming_it(cls):
    with pytest.raises(TypeError, match="momentum"):
        cls(one_param(), momentum=0.9)


BAD_VALUES = [
    (dsopt.torch.AdamW, {"lr": -1.0}, "learning rate"),
    (dsopt.torch.AdamW, {"betas": (1.0, 0.999)}, "beta parameter at index 0"),
    (dsopt.torch.Adam, {"betas": (0.9, -0.1)}, "beta parameter at index 1"),
    (dsopt.torch.Adam, {"eps": -1e-8}, "epsilon"),
    (dsopt.torch.AdamW, {"weight_decay": -0.1}, "weight_decay"),
    (dsopt.torch.AdamW, {"gradient_clipping": -1}, "gradient_clipping"),
    (dsopt.torch.AdamW, {"fp16": "yes"}, "fp16"),
    (dsopt.torch.AdamW, {"fp16": True, "bf16": True}, "bf16"),
    (dsopt.torch.AdamW, {"zero_stage": 3}, "zero_stage"),
    (dsopt.torch.AdamW, {"zero_stage": 1, "zero_optimization": {"stage": 2}}, "zero_stage"),
    (dsopt.torch.AdamW, {"zero_optimization": {"stage": 1, "bogus": 1}}, "bogus"),
    (dsopt.torch.AdamW, {"threads": -1}, "threads"),
    (dsopt.torch.AdamW, {"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
    (dsopt.torch.AdamW, {"max_consecutive_skips": 1.5}, "max_consecutive_skips"),
    (dsopt.torch.AdamW, {"skip_nonfinite": 1}, "skip_nonfinite"),
    (dsopt.torch.AdamW, {"device": "tpu"}, "device"),
    (dsopt.torch.AdamW, {"device": "cuda"}, "device"),  # the parameters are on the CPU
    (dsopt.torch.Adam, {"decoupled_weight_decay": "yes"}, "decoupled_weight_decay"),
    (dsopt.torch.OneBitAdam, {"freeze_step": 0}, "freeze_step"),
    (dsopt.torch.OneBitAdam, {"stabilize": "no"}, "stabilize"),
    (dsopt.torch.OneBitAdam, {"bias_correction": 1}, "bias_correction"),
    (dsopt.torch.ZeroOneAdam, {"bias_correction": None}, "bias_correction"),
    (dsopt.torch.OneBitAdam, {"stabilize_limit": 0}, "stabilize_limit"),
    (dsopt.torch.OneBitAdam, {"zero_stage": 2}, "zero_stage"),
    (dsopt.torch.OneBitLamb, {"max_coeff": 0.001}, "max_coeff"),
    (dsopt.torch.Lamb, {"min_coeff": 0}, "min_coeff"),
    (dsopt.torch.Lamb, {"bias_correction": "yes"}, "bias_correction"),
    (dsopt.torch.OneBitLamb, {"coeff_beta": -1}, "coeff_beta"),
    (dsopt.torch.OneBitLamb, {"factor_min": 0}, "factor_min"),
    (dsopt.torch.ZeroOneAdam, {"var_update_scaler": 0}, "var_update_scaler"),
    (dsopt.torch.ZeroOneAdam, {"local_step_clipper": "16"}, "local_step_clipper"),
    (dsopt.torch.ZeroOneAdam, {"decoupled_sync_weight_decay": None},
     "decoupled_sync_weight_decay"),
]


@pytest.mark.parametrize("cls,kwargs,match", BAD_VALUES,
                         ids=[f"{c.__name__}-{next(iter(k))}" for c, k, _ in BAD_VALUES])
def test_bad_value_is_a_value_error_naming_it(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(one_param(), **kwargs)


def test_one_bit_keywords_reach_dsopt():
    model = make_model()
    opt = dsopt.torch.OneBitAdam(model.parameters(), lr=0.01, freeze_step=3)
    compressed = []
    for step in range(4):
        train(model, opt, 1, first=step)
        compressed.append(opt.last_step_info.compressed)
    assert compressed == [False, False, True, True]
    lamb = dsopt.torch.OneBitLamb(one_param(), freeze_step=7, max_coeff=3.0, factor_threshold=0.2)
    params = lamb._config["optimizer"]["params"]
    assert (params["freeze_step"], params["max_coeff"], params["factor_threshold"],
            params["stabilize_limit"]) == (7, 3.0, 0.2, 4.0)
    zoa = dsopt.torch.ZeroOneAdam(one_param(), var_freeze_step=5, local_step_scaler=2)
    assert zoa._config["optimizer"]["params"]["var_freeze_step"] == 5
    assert zoa._config["optimizer"]["type"] == "ZeroOneAdam"


def test_lamb_keywords_reach_dsopt_and_zero_changes_no_bit():
    lamb = dsopt.torch.Lamb(one_param(), lr=0.02, max_coeff=3.0, bias_correction=False)
    assert lamb._config["optimizer"] == {
        "type": "Lamb", "params": {"lr": 0.02, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
                                   "bias_correction": False, "max_coeff": 3.0, "min_coeff": 0.01}}
    runs = []
    for stage in (0, 1, 2):
        model = make_model()
        opt = dsopt.torch.Lamb(model.parameters(), lr=0.01, weight_decay=0.01, zero_stage=stage,
                               zero_optimization={"reduce_bucket_size": 40} if stage else None)
        x, y = batch(0)
        first = torch.nn.functional.mse_loss(model(x), y).item()
        train(model, opt, 30)
        assert torch.nn.functional.mse_loss(model(x), y).item() < 0.5 * first
        runs.append(params_of(model))
    assert_equal(runs[1], runs[0])
    assert_equal(runs[2], runs[0])


def test_dsopt_settings_reach_dsopt():
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters(), gradient_clipping=0.5, threads=1,
                            max_consecutive_skips=3, skip_nonfinite=True)
    train(model, opt, 1)
    assert opt.last_step_info.grad_norm > 0  # computed for the clipping
    assert dsopt.torch.AdamW(one_param(), fp16=True).loss_scale == 2.0 ** 16
    assert dsopt.torch.AdamW(one_param(), fp16={"initial_scale_power": 8}).loss_scale == 256.0
    assert dsopt.torch.AdamW(one_param(), zero_stage=2)._facts.zero_stage == 2
    sharded = dsopt.torch.AdamW(one_param(), zero_optimization={"stage": 1,
                                                                "reduce_bucket_size": 64})
    assert sharded._config["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 64}


@pytest.mark.parametrize("name", ["Adagrad", "RAdam", "NotAnOptimizer"])
def test_unknown_names_of_the_module_say_what_exists(name):
    with pytest.raises(AttributeError, match=f"'{name}'.*dsopt.torch has .*AdamW"):
        getattr(dsopt.torch, name)
    assert not hasattr(dsopt.torch, name)


def test_every_algorithm_of_the_library_has_a_class():
    for name in dsopt.algorithm_names():
        cls = getattr(dsopt.torch, name)
        assert issubclass(cls, dsopt.torch.Optimizer) and cls._CONFIG_TYPE == name
        assert name in dsopt.torch.__all__


# ---- .grad None: frozen parameters and unused branches ----------------------------

SHAPES = ((4, 3), (7,), (3, 5), (2,))


def manual_params(seed=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen)) for s in SHAPES]


def manual_grads(step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=gen) for s in SHAPES]


SCHEDULES = {
    # which parameters have a gradient at each step (the others: .grad None)
    "frozen_from_start": lambda step, i: i != 1,
    "frozen_mid_run": lambda step, i: i != 2 or step < 4,
    "unfrozen_mid_run": lambda step, i: i != 0 or step >= 5,
    "unused_branch_on_odd_steps": lambda step, i: i != 3 or step % 2 == 0,
    "mixed": lambda step, i: (step + i) % 3 != 0,
}
STEPS = 9
KWARGS = dict(lr=0.05, betas=(0.8, 0.99), weight_decay=0.1)


def run_schedule(opt_class, schedule, params):
    opt = opt_class(params, **KWARGS)
    for step in range(STEPS):
        for i, (p, g) in enumerate(zip(params, manual_grads(step))):
            p.grad = g.clone() if schedule(step, i) else None
        opt.step()
    return opt


def per_parameter_reference(name, schedule):
    """dsopt on numpy arrays, one optimizer per parameter, stepped only when
    that parameter has a gradient: what absent gradients must give, bit
    for bit (Adam's update of a parameter depends on that parameter only)."""
    params = [p.detach().numpy().copy() for p in manual_params()]
    config = {"optimizer": {"type": "Adam", "params": {
        "lr": KWARGS["lr"], "betas": list(KWARGS["betas"]),
        "weight_decay": KWARGS["weight_decay"], "adam_w_mode": name == "AdamW"}}}
    opts = [dsopt.Optimizer(config, [p]) for p in params]
    for step in range(STEPS):
        for i, g in enumerate(manual_grads(step)):
            if schedule(step, i):
                opts[i].step([g.numpy()])
    steps = [o.param_step(0) for o in opts]
    for o in opts:
        o.close()
    return [torch.from_numpy(p) for p in params], steps


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_none_grads_as_torch_optim(name, schedule):
    ours_class, torch_class = PAIRS[name]
    initial = [p.detach().clone() for p in manual_params()]
    ours, theirs = manual_params(), manual_params()
    opt = run_schedule(ours_class, SCHEDULES[schedule], ours)
    ref = run_schedule(torch_class, SCHEDULES[schedule], theirs)
    assert_close(ours, theirs)
    want, want_steps = per_parameter_reference(name, SCHEDULES[schedule])
    assert_equal(ours, want)
    for i, p in enumerate(ours):
        never = not any(SCHEDULES[schedule](s, i) for s in range(STEPS))
        if never:
            assert torch.equal(p, initial[i])  # untouched, weight decay included
            assert p not in opt.state and theirs[i] not in ref.state
            continue
        assert opt.dsopt.param_step(i) == want_steps[i] == int(ref.state[theirs[i]]["step"])
        assert opt.state[p]["step"] == ref.state[theirs[i]]["step"]
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref.state[theirs[i]][key], **TOL)


class Branchy(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 1)
        self.side = torch.nn.Linear(8, 1)  # used on even steps only

    def forward(self, x, step):
        out = self.head(torch.tanh(self.body(x)))
        return out + self.side(x) if step % 2 == 0 else out


def train_branchy(model, opt, steps, freeze_at=None, unfreeze_at=None):
    for step in range(steps):
        if step == freeze_at:
            model.body.requires_grad_(False)
        if step == unfreeze_at:
            model.body.requires_grad_(True)
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x, step), y).backward()
        opt.step()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_model_with_frozen_layer_and_unused_branch_as_torch_optim(name, overlap):
    """A layer frozen from the start, unfrozen, frozen again; a branch used
    on even steps only: as torch.optim, and with overlap=True (hooks; the
    frozen layer gets its hook once it requires gradients) bit for bit as
    without."""
    ours_class, torch_class = PAIRS[name]
    ours, theirs, straight = Branchy(), Branchy(), Branchy()
    for model in (ours, theirs, straight):
        model.body.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overlap under torch < 2.1
        opt = ours_class(ours.parameters(), lr=0.02, weight_decay=0.1, overlap=overlap)
    ref = torch_class(theirs.parameters(), lr=0.02, weight_decay=0.1)
    plain = ours_class(straight.parameters(), lr=0.02, weight_decay=0.1)
    for model, o in ((ours, opt), (theirs, ref), (straight, plain)):
        train_branchy(model, o, 6, unfreeze_at=3)
    assert_close(list(ours.parameters()), list(theirs.parameters()))
    assert_equal(list(ours.parameters()), list(straight.parameters()))
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert (p in opt.state) == (q in ref.state)
        if q in ref.state:
            assert opt.state[p]["step"] == ref.state[q]["step"]
    assert int(opt.state[ours.body.weight]["step"]) == 3
    for model, o in ((ours, opt), (theirs, ref), (straight, plain)):
        train_branchy(model, o, 4, freeze_at=0)  # frozen again: not updated any more
    assert_close(list(ours.parameters()), list(theirs.parameters()))
    assert_equal(list(ours.parameters()), list(straight.parameters()))
    assert int(opt.state[ours.body.weight]["step"]) == 3
    opt.close()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_zero_grad_keeping_zeros_updates_parameters_as_torch(name, overlap):
    """zero_grad(set_to_none=False) leaves zero gradients, which do update
    the parameters (moments decay, weight decay applies), as in torch; with
    overlap=True (.grad handed over, then None) dsopt steps such a
    parameter with zeros just the same."""
    ours_class, torch_class = PAIRS[name]
    ours, theirs, straight = Branchy(), Branchy(), Branchy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overlap under torch < 2.1
        opt = ours_class(ours.parameters(), lr=0.02, weight_decay=0.1, overlap=overlap)
    ref = torch_class(theirs.parameters(), lr=0.02, weight_decay=0.1)
    plain = ours_class(straight.parameters(), lr=0.02, weight_decay=0.1)
    for model, o in ((ours, opt), (theirs, ref), (straight, plain)):
        for step in range(5):
            x, y = batch(step)
            o.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(model(x, step), y).backward()
            o.step()
    assert_close(list(ours.parameters()), list(theirs.parameters()))
    assert_equal(list(ours.parameters()), list(straight.parameters()))
    assert opt.state[ours.side.weight]["step"] == ref.state[theirs.side.weight]["step"] == 5
    opt.zero_grad(set_to_none=True)  # now .grad None: the side branch stays
    before = ours.side.weight.detach().clone()
    x, y = batch(5)
    torch.nn.functional.mse_loss(ours(x, 5), y).backward()
    opt.step()
    assert torch.equal(ours.side.weight, before)
    opt.close()


def test_closure_is_evaluated_and_its_loss_returned():
    ours, theirs = make_model(), make_model()
    opt = dsopt.torch.AdamW(ours.parameters(), lr=0.01)
    ref = torch.optim.AdamW(theirs.parameters(), lr=0.01)
    for step in range(3):
        x, y = batch(step)
        for model, o in ((ours, opt), (theirs, ref)):
            def closure(model=model, o=o):
                o.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss
            loss = o.step(closure)
            assert loss is not None and loss.requires_grad
    assert_close(list(ours.parameters()), list(theirs.parameters()))


# ---- hyperparameters that change mid-run ------------------------------------------

@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_every_group_hyperparameter_change_takes_effect(name):
    ours_class, torch_class = PAIRS[name]
    ours, theirs = make_model(), make_model()
    pairs = [(ours, ours_class([{"params": ours[0].parameters()},
                                {"params": ours[2].parameters(), "lr": 0.02}], lr=0.01)),
             (theirs, torch_class([{"params": theirs[0].parameters()},
                                   {"params": theirs[2].parameters(), "lr": 0.02}], lr=0.01))]
    changes = [(0, "betas", (0.5, 0.9)), (1, "eps", 1e-3), (0, "weight_decay", 0.2),
               (1, "lr", 0.05)]
    for step, (group, key, value) in enumerate(changes):
        for model, opt in pairs:
            train(model, opt, 2, first=2 * step)
            opt.param_groups[group][key] = value
    for model, opt in pairs:
        train(model, opt, 2, first=10)
    assert_close(list(ours.parameters()), list(theirs.parameters()), rtol=1e-4, atol=1e-5)
    opt = pairs[0][1]
    assert opt.dsopt.get_group_param(0, "beta1") == 0.5
    assert opt.dsopt.get_group_param(0, "beta2") == 0.9
    assert opt.dsopt.get_group_param(1, "eps") == 1e-3
    assert opt.dsopt.get_group_param(0, "weight_decay") == 0.2
    assert opt.dsopt.get_group_lr(1) == 0.05


def test_one_cycle_lr_with_momentum_cycling_matches_torch():
    ours, theirs = make_model(), make_model()
    opt = dsopt.torch.AdamW(ours.parameters(), lr=0.01)
    ref = torch.optim.AdamW(theirs.parameters(), lr=0.01)
    scheds = [torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.05, total_steps=12,
                                                  cycle_momentum=True, base_momentum=0.8,
                                                  max_momentum=0.95) for o in (opt, ref)]
    for step in range(10):
        for model, o, sched in zip((ours, theirs), (opt, ref), scheds):
            train(model, o, 1, first=step)
            sched.step()
    assert opt.param_groups[0]["betas"] == ref.param_groups[0]["betas"]
    assert opt.dsopt.get_group_param(0, "beta1") != 0.9  # cycled
    assert_close(list(ours.parameters()), list(theirs.parameters()), rtol=1e-4, atol=1e-5)


def test_cyclic_lr_cycles_beta1():
    def cyclic(opt):
        return torch.optim.lr_scheduler.CyclicLR(opt, base_lr=0.001, max_lr=0.01,
                                                 step_size_up=2, cycle_momentum=True,
                                                 base_momentum=0.8, max_momentum=0.9)
    try:
        cyclic(torch.optim.AdamW(one_param()))
    except ValueError:
        pytest.skip(f"torch {torch.__version__}'s CyclicLR cycles 'momentum' only, not betas")
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters(), lr=0.01)
    sched = cyclic(opt)
    for step in range(3):
        train(model, opt, 1, first=step)
        sched.step()
    train(model, opt, 1, first=3)
    assert opt.dsopt.get_group_param(0, "beta1") == opt.param_groups[0]["betas"][0] != 0.9


def test_invalid_group_value_raises_at_step_and_nothing_changes():
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters())
    train(model, opt, 1)
    before = params_of(model)
    for key, value, match in (("lr", -0.1, "learning rate"), ("betas", (0.9, 1.5), "beta"),
                              ("eps", float("nan"), "epsilon"),
                              ("weight_decay", -1.0, "weight_decay")):
        good = opt.param_groups[0][key]
        opt.param_groups[0][key] = value
        with pytest.raises(ValueError, match=match):
            train(model, opt, 1)
        opt.param_groups[0][key] = good
    assert_equal(params_of(model), before)
    assert opt.dsopt.param_step(0) == 1
    train(model, opt, 1)
    assert opt.dsopt.param_step(0) == 2


# ---- optimizer.state: a live view ----------------------------------------------------

def test_state_is_a_live_view_like_torchs_state():
    ours, theirs = make_model(), make_model()
    opt, ref = dsopt.torch.AdamW(ours.parameters()), torch.optim.AdamW(theirs.parameters())
    p = ours[0].weight
    assert p not in opt.state and len(opt.state) == 0 and opt.state.get(p) is None
    train(ours, opt, 3)
    train(theirs, ref, 3)
    assert len(opt.state) == len(ref.state) == 4
    assert list(opt.state) == list(ours.parameters())
    for q, r in zip(ours.parameters(), theirs.parameters()):
        entry, want = opt.state[q], ref.state[r]
        assert list(entry) == ["step", "exp_avg", "exp_avg_sq"]
        assert entry["step"].dtype == want["step"].dtype and entry["step"].dim() == 0
        assert entry["step"] == want["step"] == 3
        for key in ("exp_avg", "exp_avg_sq"):
            assert entry[key].shape == q.shape and entry[key].dtype == torch.float32
            torch.testing.assert_close(entry[key], want[key], **TOL)
    # the views share dsopt's memory: a write changes the next step, as in torch
    view = opt.state[p]["exp_avg"]
    assert view.data_ptr() == opt.state[p]["exp_avg"].data_ptr()
    np.testing.assert_array_equal(opt.dsopt.state_view(0, "exp_avg").data,
                                  view.reshape(-1).numpy())
    for o, q in ((opt, p), (ref, theirs[0].weight)):
        o.state[q]["exp_avg"].mul_(0.5)
        o.state[q]["exp_avg_sq"][0].zero_()
    train(ours, opt, 1, first=3)
    train(theirs, ref, 1, first=3)
    assert_close(list(ours.parameters()), list(theirs.parameters()))
    # step is a copy; assigning it (as += does) sets dsopt's step count
    opt.state[p]["step"].add_(10)
    assert opt.dsopt.param_step(0) == 4
    opt.state[p]["step"] += 10
    assert opt.dsopt.param_step(0) == 14


def test_state_assignments_write_through_and_other_keys_are_kept():
    model = make_model()
    opt = dsopt.torch.Adam(model.parameters())
    train(model, opt, 2)
    p = model[0].weight
    opt.state[p]["exp_avg"] = torch.ones_like(p)
    assert torch.equal(opt.state[p]["exp_avg"], torch.ones_like(p))
    opt.state[p]["step"] = torch.tensor(7.0)
    assert opt.dsopt.param_step(0) == 7
    opt.state[p]["note"] = "mine"
    assert opt.state[p]["note"] == "mine"
    untouched = torch.nn.Parameter(torch.zeros(3))
    opt.state[untouched]["x"] = 1  # torch's defaultdict(dict) behaviour
    assert opt.state[untouched] == {"x": 1} and untouched in opt.state
    with pytest.raises(ValueError, match="elements"):
        opt.state[p]["exp_avg_sq"] = torch.zeros(3)
    with pytest.raises(ValueError, match="cannot be deleted"):
        del opt.state[p]["exp_avg"]
    snapshot = copy.deepcopy(opt.state)  # a plain dict, over copies (as torch's)
    assert type(snapshot) is dict and len(snapshot) == 5
    copied = next(iter(snapshot.values()))
    assert torch.equal(copied["exp_avg"], opt.state[p]["exp_avg"])
    assert copied["exp_avg"].data_ptr() != opt.state[p]["exp_avg"].data_ptr()


def test_keys_stored_before_the_first_step_do_not_hide_dsopts_state():
    model = make_model()
    opt = dsopt.torch.Adam(model.parameters())
    p = model[0].weight
    opt.state[p]["step"] = 100.0  # no state yet: kept as other keys
    opt.state[p]["exp_avg"] = torch.full_like(p, 5.0)
    opt.state[p]["note"] = "mine"
    train(model, opt, 2)
    entry = opt.state[p]
    assert entry["step"] == 2 and opt.dsopt.param_step(0) == 2
    np.testing.assert_array_equal(opt.dsopt.state_view(0, "exp_avg").data,
                                  entry["exp_avg"].reshape(-1).numpy())
    assert entry["note"] == "mine"
    assert list(entry) == ["step", "exp_avg", "exp_avg_sq", "note"]
    train(model, opt, 1, first=2)
    assert opt.state[p]["step"] == 3


def test_state_views_are_fetched_again_after_every_state_load(monkeypatch):
    """A state load can rebuild dsopt's buffers (the 1-bit optimizers'
    worker_error): opt.state's cached views are dropped by every load."""
    model = make_model()
    opt = dsopt.torch.Adam(model.parameters())
    train(model, opt, 2)
    p = model[0].weight
    saved, torch_saved = opt.state_dict(), opt.torch_state_dict()
    fetched = []
    state_view = opt.dsopt.state_view

    def counting(i, name):
        fetched.append((i, name))
        return state_view(i, name)

    monkeypatch.setattr(opt.dsopt, "state_view", counting)
    for load in (lambda: opt.load_state_dict(saved),
                 lambda: opt.load_state_dict_shards([saved]),
                 lambda: opt.load_state_dict(torch_saved)):
        opt.state[p]["exp_avg"]
        fetched.clear()
        opt.state[p]["exp_avg"]
        assert fetched == []  # cached
        load()
        fetched.clear()
        opt.state[p]["exp_avg"]
        assert (0, "exp_avg") in fetched


def test_a_state_tensor_without_a_view_is_a_clear_error_and_changes_nothing(monkeypatch):
    """A required state tensor dsopt gives no view of (a ZeRO parameter
    split by the reduce buckets, simulated here): loading or exporting a
    torch state dict and add_param_group raise ValueError naming it before
    anything is written."""
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters())
    train(model, opt, 2)
    changed = copy.deepcopy(opt.torch_state_dict())
    for entry in changed["state"].values():
        entry["exp_avg"].fill_(1.0)
        entry["step"] = torch.tensor(9.0)
    before = [opt.dsopt.state_view(i, "exp_avg").data.copy() for i in range(4)]
    state_view = opt.dsopt.state_view

    def split(i, name):
        if i == 2 and name == "exp_avg_sq":
            raise dsopt.InvalidArgument("parameter 2 is split by the reduce buckets")
        return state_view(i, name)

    monkeypatch.setattr(opt.dsopt, "state_view", split)
    opt.state.invalidate()
    message = "parameter 2's state 'exp_avg_sq' has no view"
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(changed)
    for i in range(4):
        np.testing.assert_array_equal(state_view(i, "exp_avg").data, before[i])
        assert opt.dsopt.param_step(i) == 2
    with pytest.raises(ValueError, match=message):
        opt.torch_state_dict()
    inner = opt.dsopt
    with pytest.raises(ValueError, match=message):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert opt.dsopt is inner and len(opt.param_groups) == 1


def test_a_group_decoupled_weight_decay_other_than_the_optimizers_is_an_error():
    """torch >= 2.6 groups carry decoupled_weight_decay; dsopt has one
    weight-decay mode per optimizer, so a group asking for the other one is
    a ValueError naming it (at creation, add_param_group and loads)."""
    model = make_model()
    message = "decoupled_weight_decay=True differs"
    with pytest.raises(ValueError, match=message):
        dsopt.torch.Adam([{"params": model[0].parameters(), "decoupled_weight_decay": True}])
    with pytest.raises(ValueError, match="decoupled_weight_decay=False differs"):
        dsopt.torch.AdamW([{"params": model[0].parameters(), "decoupled_weight_decay": False}])
    opt = dsopt.torch.Adam(model[0].parameters(), decoupled_weight_decay=False)
    with pytest.raises(ValueError, match=message):
        opt.add_param_group({"params": model[2].parameters(), "decoupled_weight_decay": True})
    assert len(opt.param_groups) == 1
    saved = opt.state_dict()
    saved["param_groups"][0]["decoupled_weight_decay"] = True
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(saved)
    same = dsopt.torch.AdamW([{"params": model[2].parameters(), "decoupled_weight_decay": True}])
    same.close()
    opt.close()


def test_state_of_16_bit_parameters_has_fp32_masters():
    p = torch.nn.Parameter(torch.linspace(-1, 1, 10).to(torch.bfloat16))
    q = torch.nn.Parameter(torch.ones(3))
    opt = dsopt.torch.AdamW([p, q], lr=0.01)
    p.grad, q.grad = torch.ones_like(p), torch.ones_like(q)
    opt.step()
    assert list(opt.state[p]) == ["step", "exp_avg", "exp_avg_sq", "master"]
    assert "master" not in opt.state[q]
    master = opt.state[p]["master"]
    assert master.dtype == torch.float32 and master.shape == p.shape
    assert torch.equal(master.to(torch.bfloat16), p.detach())


def test_state_under_zero_is_flat_with_its_offset():
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters(), zero_stage=2)
    train(model, opt, 2)
    for p in model.parameters():
        entry = opt.state[p]
        assert entry["offset"] == 0  # one rank holds all of every parameter
        assert entry["exp_avg"].shape == (p.numel(),)
        # Written back unchanged, as frameworks that move the state to a
        # device do, it stays; another offset is an error.
        before = entry["exp_avg"].clone()
        for key, value in list(entry.items()):
            entry[key] = value.to(p.device) if torch.is_tensor(value) else value
        assert torch.equal(opt.state[p]["exp_avg"], before) and opt.state[p]["offset"] == 0
        with pytest.raises(ValueError, match="offset"):
            entry["offset"] = 1


@pytest.mark.parametrize("cls,names", [
    (dsopt.torch.Lamb, ["exp_avg", "exp_avg_sq"]),
    (dsopt.torch.OneBitAdam, ["exp_avg", "exp_avg_sq"]),
    (dsopt.torch.OneBitLamb, ["exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"]),
    (dsopt.torch.ZeroOneAdam, ["exp_avg", "exp_avg_sq"])], ids=lambda x: getattr(x, "__name__", ""))
def test_state_of_lamb_and_the_one_bit_optimizers(cls, names):
    model = make_model()
    opt = cls(model.parameters(), lr=0.01)
    train(model, opt, 2)
    entry = opt.state[model[0].weight]
    assert list(entry) == ["step"] + names and entry["step"] == 2
    with pytest.raises(dsopt.Unsupported):
        entry["step"] = 1  # steps follow the steps applied (the 1-bit optimizers' stages, LAMB's)


# ---- torch.optim <-> dsopt ------------------------------------------------------------

def save_load(state_dict):
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    buf.seek(0)
    return torch.load(buf)


def two_groups(model):
    return [{"params": model[0].parameters(), "lr": 0.02},
            {"params": model[2].parameters(), "weight_decay": 0.05}]


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_torch_run_continues_on_dsopt(name):
    """10 torch steps, the state dict (through torch.save) into dsopt, 10
    dsopt steps: the 20 torch steps within fp32 rounding."""
    ours_class, torch_class = PAIRS[name]
    straight, moved = make_model(), make_model()
    train(straight, torch_class(two_groups(straight), lr=0.01), 20)
    first = torch_class(two_groups(moved), lr=0.01)
    train(moved, first, 10)
    opt = ours_class(two_groups(moved), lr=0.5, betas=(0.5, 0.5))
    snapshot = params_of(moved)
    train(moved, opt, 1, first=100)  # some state of its own: replaced by the load
    with torch.no_grad():
        for p, value in zip(moved.parameters(), snapshot):
            p.copy_(value)
    opt.load_state_dict(save_load(first.state_dict()))
    assert [g["lr"] for g in opt.param_groups] == [0.02, 0.01]
    assert [g["weight_decay"] for g in opt.param_groups] == [first.defaults["weight_decay"],
                                                             0.05]
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)
    assert opt.dsopt.get_group_param(0, "beta1") == 0.9
    assert opt.dsopt.get_group_lr(0) == 0.02
    assert opt.dsopt.get_group_param(1, "weight_decay") == 0.05
    assert [opt.dsopt.param_step(i) for i in range(4)] == [10] * 4
    train(moved, opt, 10, first=10)
    assert_close(list(moved.parameters()), list(straight.parameters()))


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_dsopt_run_continues_on_torch(name):
    """10 dsopt steps, torch_state_dict() (through torch.save) into
    torch.optim, 10 torch steps: the 20 dsopt steps within fp32 rounding;
    the exported dict has the keys and types of torch's own."""
    ours_class, torch_class = PAIRS[name]
    straight, moved = make_model(), make_model()
    train(straight, ours_class(two_groups(straight), lr=0.01), 20)
    opt = ours_class(two_groups(moved), lr=0.01)
    train(moved, opt, 10)
    exported = opt.torch_state_dict()
    native_model = make_model()
    native = torch_class(two_groups(native_model), lr=0.01)
    train(native_model, native, 1)
    want = native.state_dict()  # torch's own format in this torch version
    assert exported.keys() == want.keys()
    for got_group, want_group in zip(exported["param_groups"], want["param_groups"]):
        assert got_group.keys() == want_group.keys()
        for key in want_group:
            assert got_group[key] == want_group[key], key
    assert exported["state"].keys() == want["state"].keys()
    for k, entry in exported["state"].items():
        assert entry.keys() == want["state"][k].keys()
        for key, value in entry.items():
            assert value.dtype == want["state"][k][key].dtype, key
            assert value.shape == want["state"][k][key].shape, key
    theirs = torch_class(two_groups(moved), lr=0.5)
    theirs.load_state_dict(save_load(exported))
    assert [g["lr"] for g in theirs.param_groups] == [0.02, 0.01]
    train(moved, theirs, 10, first=10)
    assert_close(list(moved.parameters()), list(straight.parameters()))


def test_torch_state_dict_leaves_out_parameters_never_updated():
    model = make_model()
    model[0].bias.requires_grad_(False)
    opt = dsopt.torch.AdamW(model.parameters())
    train(model, opt, 2)
    assert sorted(opt.torch_state_dict()["state"]) == [0, 2, 3]
    fresh = dsopt.torch.AdamW(make_model().parameters())
    fresh.load_state_dict(opt.torch_state_dict())
    assert [fresh.dsopt.param_step(i) for i in range(4)] == [2, 0, 2, 2]


def test_torch_state_dict_is_rejected_where_it_cannot_fit_and_nothing_changes():
    model = make_model()
    opt = dsopt.torch.AdamW(model.parameters(), lr=0.01)
    train(model, opt, 2)
    before = opt.state_dict()
    source = make_model()
    good = torch.optim.AdamW(source.parameters())
    train(source, good, 1)
    good = good.state_dict()

    def variant(**change):
        sd = copy.deepcopy(good)
        for key, value in change.items():
            if key == "groups":
                sd["param_groups"] = value(sd["param_groups"])
            elif key == "entry":
                value(sd["state"][0])
            else:
                sd[key] = value
        return sd

    bad = {
        "parameter groups": variant(groups=lambda g: g + g),
        "doesn't match|parameter group 0": variant(groups=lambda g: [dict(g[0], params=[0])]),
        "amsgrad": variant(groups=lambda g: [dict(g[0], amsgrad=True)]),
        "maximize": variant(groups=lambda g: [dict(g[0], maximize=True)]),
        "shape": variant(entry=lambda e: e.update(exp_avg=torch.zeros(3))),
        "lacks": variant(entry=lambda e: e.pop("exp_avg_sq")),
        "step": variant(entry=lambda e: e.update(step=torch.tensor(-1.0))),
        "learning rate": variant(groups=lambda g: [dict(g[0], lr=-1.0)]),
    }
    for match, sd in bad.items():
        with pytest.raises(ValueError, match=match):
            opt.load_state_dict(sd)
    assert opt.state_dict() == before
    with pytest.raises(ValueError, match="do not count their own steps"):
        dsopt.torch.OneBitAdam(make_model().parameters()).load_state_dict(good)
    with pytest.raises(ValueError, match="do not count their own steps"):
        dsopt.torch.ZeroOneAdam(make_model().parameters()).torch_state_dict()


def test_torch_state_moves_into_zero_and_into_16_bit_parameters():
    source = make_model()
    ref = torch.optim.AdamW(source.parameters(), lr=0.01)
    train(source, ref, 3)
    model = make_model()
    model.load_state_dict(source.state_dict())
    opt = dsopt.torch.AdamW(model.parameters(), lr=0.01, zero_stage=2)
    opt.load_state_dict(ref.state_dict())
    for p, q in zip(model.parameters(), source.parameters()):
        torch.testing.assert_close(opt.state[p]["exp_avg"], ref.state[q]["exp_avg"].reshape(-1))
    assert opt.torch_state_dict()["state"].keys() == ref.state_dict()["state"].keys()

    half = torch.nn.Parameter(torch.linspace(-1, 1, 6).to(torch.bfloat16))
    h_opt = dsopt.torch.AdamW([half])
    h_opt.load_state_dict({"state": {0: {"step": torch.tensor(4.0),
                                         "exp_avg": torch.full((6,), 0.5),
                                         "exp_avg_sq": torch.full((6,), 0.25)}},
                           "param_groups": [dict(h_opt.param_groups[0], params=[0])]})
    assert torch.equal(h_opt.state[half]["master"], half.detach().float())
    assert h_opt.dsopt.param_step(0) == 4


# ---- add_param_group ----------------------------------------------------------------

def test_add_param_group_continues_as_if_the_group_had_been_there_without_gradients():
    """A parameter without gradients is not touched, so a group added later
    must give the same bits as one present from the start whose .grad
    stayed None until then; the old groups' state, steps and changed
    hyperparameters are carried over exactly."""
    def run(add_later):
        model = make_model()
        head = list(model[2].parameters())
        if add_later:
            opt = dsopt.torch.AdamW(model[0].parameters(), lr=0.01)
        else:
            opt = dsopt.torch.AdamW([{"params": model[0].parameters()},
                                     {"params": head, "lr": 0.03, "betas": (0.8, 0.9)}],
                                    lr=0.01)
        for step in range(8):
            if step == 4:
                opt.param_groups[0]["lr"] = 0.02
                opt.param_groups[0]["eps"] = 1e-6
                if add_later:
                    opt.add_param_group({"params": head, "lr": 0.03, "betas": (0.8, 0.9)})
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            if step < 4:
                for p in head:
                    p.grad = None
            opt.step()
        return model, opt

    got, opt = run(True)
    want, ref = run(False)
    assert_equal(list(got.parameters()), list(want.parameters()))
    assert [opt.dsopt.param_step(i) for i in range(4)] == [8, 8, 4, 4]
    assert len(opt.param_groups) == 2 and opt.dsopt.num_groups == 2
    assert opt.param_groups[1]["betas"] == (0.8, 0.9) and "amsgrad" in opt.param_groups[1]
    assert opt.dsopt.get_group_param(0, "eps") == 1e-6
    # the rebuilt optimizer saves and loads as one created with both groups
    saved = opt.state_dict()
    ref.load_state_dict(saved)
    assert ref.state_dict()["dsopt_state"] == saved["dsopt_state"]


def test_add_param_group_carries_fp32_masters_of_16_bit_parameters():
    def run(add_later):
        gen = torch.Generator().manual_seed(0)
        a = torch.nn.Parameter(torch.randn(20, generator=gen).to(torch.bfloat16))
        b = torch.nn.Parameter(torch.randn(5, generator=gen).to(torch.bfloat16))
        opt = dsopt.torch.AdamW([a] if add_later else [a, b], lr=0.01)
        for step in range(6):
            if step == 3 and add_later:
                opt.add_param_group({"params": [b]})
            gen = torch.Generator().manual_seed(10 + step)
            a.grad = torch.randn(20, generator=gen).to(torch.bfloat16)
            b.grad = torch.randn(5, generator=gen).to(torch.bfloat16) if step >= 3 else None
            opt.step()
        return [a, b]

    assert_equal(run(True), run(False))


def test_add_param_group_errors_change_nothing():
    model = make_model()
    opt = dsopt.torch.AdamW(model[0].parameters())
    train(model, opt, 1)
    with pytest.raises(dsopt.InvalidArgument, match="momentum"):
        opt.add_param_group({"params": model[2].parameters(), "momentum": 0.9})
    with pytest.raises(ValueError, match="amsgrad"):
        opt.add_param_group({"params": model[2].parameters(), "amsgrad": True})
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": model[0].parameters()})
    assert len(opt.param_groups) == 1 and opt.dsopt.num_groups == 1
    train(model, opt, 1)
    assert opt.dsopt.param_step(0) == 2


@pytest.mark.parametrize("cls", [dsopt.torch.Lamb, dsopt.torch.OneBitAdam, dsopt.torch.OneBitLamb,
                                 dsopt.torch.ZeroOneAdam], ids=lambda c: c.__name__)
def test_one_bit_add_param_group_before_the_first_step_only(cls):
    model = make_model()
    opt = cls(model[0].parameters(), lr=0.01)
    opt.add_param_group({"params": model[2].parameters(), "lr": 0.02})
    train(model, opt, 1)
    assert opt.dsopt.num_groups == 2 and opt.dsopt.param_step(3) == 1
    with pytest.raises(RuntimeError, match="first step"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
    assert len(opt.param_groups) == 2


# ---- copy.deepcopy ----------------------------------------------------------------

@pytest.mark.parametrize("cls", [dsopt.torch.AdamW, dsopt.torch.Adam, dsopt.torch.OneBitAdam],
                         ids=lambda c: c.__name__)
def test_deepcopy_is_an_independent_optimizer_with_the_same_state(cls):
    model = make_model()
    opt = cls(two_groups(model), lr=0.01)
    train(model, opt, 2)
    opt.param_groups[1]["lr"] = 0.004
    train(model, opt, 1, first=2)
    opt.state[model[0].weight]["note"] = [1, 2]
    model_copy, opt_copy = copy.deepcopy((model, opt))
    assert type(opt_copy) is cls
    assert opt_copy.param_groups[0]["params"][0] is model_copy[0].weight
    assert opt_copy.state[model_copy[0].weight]["note"] == [1, 2]
    assert opt_copy.param_groups[1]["lr"] == 0.004
    assert opt_copy.state_dict()["dsopt_state"] == opt.state_dict()["dsopt_state"]
    train(model, opt, 3, first=3)
    train(model_copy, opt_copy, 3, first=3)
    assert_equal(list(model_copy.parameters()), list(model.parameters()))
    alone = copy.deepcopy(opt)  # over copies of the parameters
    assert alone.param_groups[0]["params"][0] is not model[0].weight
    assert torch.equal(alone.param_groups[0]["params"][0], model[0].weight)
    opt_copy.close()
    train(model, opt, 1, first=6)  # the original is unaffected


def test_pickled_optimizer_unpickles_over_the_unpickled_parameters():
    """Pickling works as with torch's optimizers (torch.save(opt); torch
    1.13's OneCycleLR state dict pickles its optimizer): unpickling gives an
    optimizer with the same state over the unpickled parameters."""
    model = make_model()
    opt = dsopt.torch.AdamW(two_groups(model), lr=0.01)
    train(model, opt, 3)
    opt.state[model[2].bias]["note"] = "kept"
    model_copy, opt_copy = pickle.loads(pickle.dumps((model, opt)))
    assert type(opt_copy) is dsopt.torch.AdamW
    assert opt_copy.param_groups[1]["params"][1] is model_copy[2].bias
    assert opt_copy.state[model_copy[2].bias]["note"] == "kept"
    assert opt_copy.state_dict()["dsopt_state"] == opt.state_dict()["dsopt_state"]
    train(model, opt, 2, first=3)
    train(model_copy, opt_copy, 2, first=3)
    assert_equal(list(model_copy.parameters()), list(model.parameters()))
    shallow = copy.copy(opt)  # a second optimizer over the same parameters
    assert shallow.param_groups[0]["params"][0] is model[0].weight
    assert shallow.dsopt is not opt.dsopt


# ---- several ranks ------------------------------------------------------------------

def test_zero_shards_take_a_torch_state_dict_at_two_ranks(tmp_path):
    """mpirun -np 2 (mpi_torch_state.py): ZeRO stage 2 takes a torch.optim
    state dict into its shards, the ranks' parts of every parameter cover
    it once, what needs the whole state is refused, training goes on as
    torch's; state_dict_all_ranks gathered through mpi4py resumes every
    rank's shard bit for bit."""
    import shutil
    import sys
    from pathlib import Path

    import mpi_runner
    import mpi_torch_state
    from dsopt_testing import build_feature

    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    pytest.importorskip("mpi4py", reason=f"mpi4py is not installed for {sys.executable}")
    mpi_runner.mpirun(Path(mpi_torch_state.__file__), 2, tmp_path,
                      ["zero_state", "whole_checkpoint"], timeout=240)
    reports = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert all("whole_checkpoint OK" in report for report in reports), reports
    held = [int(report.split("zero_state OK")[1].split()[0]) for report in reports]
    assert sum(held) == sum(p.numel() for p in make_model().parameters()) and min(held) > 0
