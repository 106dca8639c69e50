"""LAMB ("type": "Lamb", docs/optimizers/lamb.md) in one process: parameters
equal the numpy reference (lamb_reference.py) bit for bit with and without
bias correction, weight decay, groups, 16-bit parameters, clipping, a
static loss scale, trust ratios clamped at both ends and tensors of several
sum blocks; an absent gradient steps the parameter with zeros; resume is
bit-identical; ZeRO stage 1/2 on one rank, with buckets that cut tensors'
sum blocks, equal stage 0 and show the same state views; the config keys
and the combinations that are rejected. Stage 0 and ZeRO at 1-4 ranks
against each other and the reference: test_zero.py (mpi_zero.py)."""

import numpy as np
import pytest

import dsopt
from lamb_reference import LambReference
from zero_runs import as_dsopt, random_params

SIZES = (37, 9000, 3, 5000)


def lamb(**params):
    return {"optimizer": {"type": "Lamb", "params": dict({"lr": 1e-2}, **params)}}


def with_top(config, **top):
    return dict(config, **top)


CASES = {
    "defaults": lamb(),
    "no_bias_correction": lamb(bias_correction=False),
    "weight_decay_groups": with_top(lamb(weight_decay=0.01, betas=[0.8, 0.99]),
                                    param_groups=[{}, {"lr": 3e-3, "weight_decay": 0.1}]),
    "clamped": lamb(max_coeff=1.0, min_coeff=0.9, weight_decay=0.01),
    "clipping": with_top(lamb(), gradient_clipping=0.5, report_grad_norm=True),
    "static_loss_scale": with_top(lamb(), fp16={"enabled": True, "loss_scale": 256}),
}
KINDS = {"fp32": ["fp32"] * 4, "mixed": ["fp16", "bf16", "fp32", "bf16"]}


def initial(kinds, seed=0):
    return random_params(np.random.default_rng(seed), SIZES, kinds)


def grads(step, scale=1.0, seed=0):
    rng = np.random.default_rng([seed, step])
    return [(rng.standard_normal(n) * (0.5 + i) * scale).astype(np.float32) for i, n in enumerate(SIZES)]


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_bits(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(bits(a), bits(b)), f"{what}: tensor {i} differs"


def values(opt):
    return [p.array.copy() if hasattr(p, "array") else p.copy() for p in opt.params]


@pytest.mark.parametrize("kinds", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_matches_the_reference_bit_for_bit(case, kinds):
    config, kind_list = CASES[case], KINDS[kinds]
    groups = [0, 1, 0, 1] if "param_groups" in config else None
    params = initial(kind_list)
    scale = config.get("fp16", {}).get("loss_scale", 1.0)
    ref = LambReference(config, [p.copy() for p in params], 1, group_of=groups, kinds=kind_list,
                        loss_scale=scale)
    with dsopt.Optimizer(config, as_dsopt(params, kind_list), groups=groups) as opt:
        for k in range(6):
            info = opt.step(grads(k, scale))
            want = ref.step([grads(k, scale)])
            assert not info.skipped
            if want["grad_norm"] >= 0:
                assert info.grad_norm == pytest.approx(want["grad_norm"], rel=1e-6)
            assert_same_bits(values(opt), ref.params(), f"{case}/{kinds} step {k + 1}")


def test_trust_ratio_clamps_bind():
    """The clamped case is only a test when both clamps bind somewhere:
    the unclamped ratios of its first steps fall outside [0.9, 1.0]."""
    config = CASES["clamped"]
    ref = LambReference(lamb(weight_decay=0.01, max_coeff=1e9, min_coeff=1e-9), initial(KINDS["fp32"]), 1)
    seen = []
    original = ref._apply
    ref._apply = lambda i, coeff, u: (seen.append(coeff), original(i, coeff, u))
    for k in range(3):
        ref.step([grads(k)])
    k = config["optimizer"]["params"]
    assert min(seen) < k["min_coeff"] and max(seen) > k["max_coeff"], seen


def test_an_absent_gradient_steps_the_parameter_with_zeros():
    params = initial(KINDS["fp32"])
    ref = LambReference(lamb(weight_decay=0.01), [p.copy() for p in params], 1)
    with dsopt.Optimizer(lamb(weight_decay=0.01), params) as opt:
        for k in range(3):
            g = grads(k)
            g[2] = None if k == 1 else g[2]
            opt.step(g)
            ref.step([[np.zeros(SIZES[2], np.float32) if x is None else x for x in g]])
        assert [opt.param_step(i) for i in range(4)] == [3, 3, 3, 3]
        assert_same_bits(values(opt), ref.params(), "absent gradient")


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_resume_is_bit_identical(stage):
    zero = {"zero_optimization": {"stage": stage, "reduce_bucket_size": 1000}} if stage else {}
    config = with_top(lamb(weight_decay=0.01), **zero)
    kinds = KINDS["mixed"]
    with dsopt.Optimizer(config, as_dsopt(initial(kinds), kinds)) as whole:
        for k in range(3):
            whole.step(grads(k))
        blob, saved = whole.state_dict(), values(whole)
        for k in range(3, 6):
            whole.step(grads(k))
        final = values(whole)
    with dsopt.Optimizer(config, as_dsopt(saved, kinds)) as resumed:
        resumed.load_state_dict(blob)
        for k in range(3, 6):
            resumed.step(grads(k))
        assert_same_bits(values(resumed), final, f"stage {stage} resumed")


@pytest.mark.parametrize("zero", [{"stage": 1}, {"stage": 2, "reduce_bucket_size": 1000},
                                  {"stage": 2, "reduce_bucket_size": 96}])
def test_zero_on_one_rank_is_stage_0_with_the_same_state_views(zero):
    kinds = KINDS["mixed"]
    runs = []
    for config in (lamb(weight_decay=0.01), with_top(lamb(weight_decay=0.01), zero_optimization=zero)):
        with dsopt.Optimizer(config, as_dsopt(initial(kinds), kinds)) as opt:
            for k in range(4):
                opt.step(grads(k))
            views = {name: [np.array(opt.state_view(i, name).data) for i in (0, 1, 3)]
                     for name in ("exp_avg", "exp_avg_sq", "master")}  # 16-bit: masters
            runs.append((values(opt), views))
    assert_same_bits(runs[1][0], runs[0][0], f"ZeRO {zero}")
    for name, arrays in runs[0][1].items():
        assert_same_bits(runs[1][1][name], arrays, f"ZeRO {zero}: view {name}")


def test_a_lamb_blob_is_not_another_algorithms():
    with dsopt.Optimizer(lamb(), initial(KINDS["fp32"])) as opt:
        opt.step(grads(0))
        blob = opt.state_dict()
    for other in ("AdamW", "OneBitLamb"):
        with dsopt.Optimizer({"optimizer": {"type": other}}, initial(KINDS["fp32"])) as opt:
            with pytest.raises(dsopt.Mismatch, match="Lamb"):
                opt.load_state_dict(blob)


@pytest.mark.parametrize("params,error,pattern", [
    ({"max_grad_norm": 1.0}, dsopt.InvalidArgument, "gradient_clipping"),
    ({"eps_inside_sqrt": True}, dsopt.InvalidArgument, "outside the square root"),
    ({"coeff_beta": 0.9}, dsopt.InvalidArgument, "unknown key"),
    ({"freeze_step": 10}, dsopt.InvalidArgument, "unknown key"),
    ({"adam_w_mode": False}, dsopt.InvalidArgument, "unknown key"),
    ({"amsgrad": True}, dsopt.InvalidArgument, "AMSGrad"),
    ({"min_coeff": 0.0}, dsopt.InvalidArgument, "min_coeff"),
    ({"max_coeff": 0.001}, dsopt.InvalidArgument, "max_coeff"),
])
def test_bad_params_are_rejected(params, error, pattern):
    with pytest.raises(error, match=pattern):
        dsopt.Optimizer(lamb(**params), initial(KINDS["fp32"]))


def test_deepspeed_keys_that_do_not_change_the_update_are_accepted():
    config = lamb(eps_inside_sqrt=False, amsgrad=False, cuda_aware=False)
    assert dsopt.canonical_config(config)["optimizer"]["params"] == {
        "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
        "bias_correction": True, "max_coeff": 10.0, "min_coeff": 0.01}


@pytest.mark.parametrize("opt_type", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam"])
def test_zero_with_a_one_bit_optimizer_says_why_not(opt_type):
    config = {"optimizer": {"type": opt_type}, "zero_optimization": {"stage": 1}}
    with pytest.raises(dsopt.Unsupported, match="whole momentum"):
        dsopt.Optimizer(config, initial(KINDS["fp32"]))


def test_cpu_offload_of_lamb_on_the_cpu_changes_nothing():
    """offload_optimizer moves a CUDA optimizer's state to the host; a CPU
    optimizer's already lives there (on CUDA, LAMB with offload is
    rejected: docs/optimizers/lamb.md)."""
    out = []
    for offload in ("none", "cpu"):
        config = with_top(lamb(), zero_optimization={"stage": 2, "offload_optimizer": {"device": offload}})
        with dsopt.Optimizer(config, initial(KINDS["fp32"])) as opt:
            for k in range(2):
                opt.step(grads(k))
            out.append(values(opt))
    assert_same_bits(out[1], out[0], "offload on the CPU")
