"""fp16/bf16 parameters with fp32 masters, and 16-bit gradients."""

import numpy as np
import pytest

import dsopt
from dsopt_testing import adam_config, assert_fp32_close, random_grads, reference_for
from halfprec import assert_within_ulps, bf16_bits_to_float, to_bf16_bits, to_fp16

STEPS = 25
SIZES = [1, 7, 33, 1000, 4099, 100003]


def fp16_params(rng, sizes):
    return [rng.standard_normal(n).astype(np.float16) for n in sizes]


def bf16_params(rng, sizes):
    return [to_bf16_bits(rng.standard_normal(n)) for n in sizes]


@pytest.mark.parametrize("opt_type, extra", [("AdamW", {}), ("Adam", {"adam_w_mode": False})])
def test_fp16_params_are_rounded_fp32_master(rng, opt_type, extra):
    config = adam_config(opt_type, lr=1e-2, weight_decay=0.1, **extra)
    params = fp16_params(rng, SIZES)
    initial = [p.copy() for p in params]
    ref = reference_for(config, [p.astype(np.float64) for p in params])
    with dsopt.Optimizer(config, params) as opt:
        for k in range(STEPS):
            grads = random_grads(rng, SIZES)
            opt.step(grads)
            ref.step(grads)
            for i, p in enumerate(params):
                assert_within_ulps(p, to_fp16(ref.p[i]), what=f"step {k + 1} param {i}")
    assert any(not np.array_equal(p, q) for p, q in zip(params, initial))


@pytest.mark.parametrize("tag", ["wrapper", "tuple"])
def test_bf16_params_are_rounded_fp32_master(rng, tag):
    config = adam_config("AdamW", lr=2e-2, weight_decay=0.1)
    bits = bf16_params(rng, SIZES)
    initial = [b.copy() for b in bits]
    wrapped = [dsopt.bf16(b) if tag == "wrapper" else (b, "bfloat16") for b in bits]
    ref = reference_for(config, [bf16_bits_to_float(b) for b in bits])
    with dsopt.Optimizer(config, wrapped) as opt:
        for k in range(STEPS):
            grads = random_grads(rng, SIZES)
            opt.step(grads)
            ref.step(grads)
            for i, b in enumerate(bits):
                assert_within_ulps(b, to_bf16_bits(ref.p[i]), what=f"step {k + 1} param {i}")
    assert any(not np.array_equal(b, c) for b, c in zip(bits, initial))


def test_small_updates_accumulate_in_the_bf16_master(rng):
    # Each update is far below half a bf16 ulp; only a master copy keeps them.
    config = adam_config("AdamW", lr=1e-4)
    bits = [to_bf16_bits(1.0 + rng.random(1000))]
    initial = bits[0].copy()
    ref = reference_for(config, [bf16_bits_to_float(bits[0])])
    grad = [np.abs(rng.standard_normal(1000)).astype(np.float32) + 0.5]
    with dsopt.Optimizer(config, [dsopt.bf16(bits[0])]) as opt:
        for _ in range(80):
            opt.step(grad)
            ref.step(grad)
    assert_within_ulps(bits[0], to_bf16_bits(ref.p[0]), what="bf16 params")
    assert np.count_nonzero(bits[0] != initial) > 100


@pytest.mark.parametrize("grad_dtype", ["float16", "bfloat16"])
def test_16bit_grads_with_fp32_params_are_read_exactly(rng, grad_dtype):
    sizes = [7, 33, 1000, 4099]
    config = adam_config("AdamW", lr=5e-3, weight_decay=0.05)
    params = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    ref = reference_for(config, params)
    with dsopt.Optimizer(config, params) as opt:
        for _ in range(STEPS):
            grads32 = random_grads(rng, sizes)
            if grad_dtype == "float16":
                grads = [g.astype(np.float16) for g in grads32]
                exact = [g.astype(np.float64) for g in grads]
            else:
                grads = [dsopt.bf16(to_bf16_bits(g)) for g in grads32]
                exact = [bf16_bits_to_float(g.array).astype(np.float64) for g in grads]
            opt.step(grads)
            ref.step(exact)
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i}")


def test_fp16_params_with_bf16_grads(rng):
    sizes = [33, 1000]
    config = adam_config("AdamW", lr=1e-2)
    params = fp16_params(rng, sizes)
    ref = reference_for(config, [p.astype(np.float64) for p in params])
    with dsopt.Optimizer(config, params) as opt:
        for _ in range(STEPS):
            grads = [to_bf16_bits(g) for g in random_grads(rng, sizes)]
            opt.step([(g, "bfloat16") for g in grads])
            ref.step([bf16_bits_to_float(g) for g in grads])
    for i, p in enumerate(params):
        assert_within_ulps(p, to_fp16(ref.p[i]), what=f"param {i}")


def test_ml_dtypes_bfloat16_arrays_need_no_tag(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes not installed")
    config = adam_config("AdamW", lr=1e-2)
    bits = to_bf16_bits(rng.standard_normal(33))
    tagged = bits.copy()
    native = bits.copy().view(ml_dtypes.bfloat16)
    grads = [random_grads(rng, [33]) for _ in range(5)]
    with dsopt.Optimizer(config, [dsopt.bf16(tagged)]) as a, dsopt.Optimizer(config, [native]) as b:
        for g in grads:
            a.step(g)
            b.step(g)
    assert np.array_equal(native.view(np.uint16), tagged)
