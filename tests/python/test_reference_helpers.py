"""The test references themselves: bf16 rounding, ulp distance, Adam's first
step, and the loss scaler's documented sequences."""

import numpy as np
import pytest

from adam_reference import AdamReference, Hyper, LossScalerReference
from halfprec import assert_within_ulps, bf16_bits_to_float, ordered, to_bf16_bits


def test_bf16_rounds_to_nearest_even():
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7 + 2**-9, -(1 + 2**-8), np.inf],
                      np.float32)
    assert [int(b) for b in to_bf16_bits(values)] == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xBF80, 0x7F80]
    assert bf16_bits_to_float(np.array([0x3F82], np.uint16))[0] == 1 + 2**-6


def test_ulp_distance_crosses_zero():
    assert list(ordered(np.array([0x0001, 0x8001, 0x3C00], np.uint16))) == [1, -1, 0x3C00]
    assert_within_ulps(np.array([0x0000], np.uint16), np.array([0x8001], np.uint16), atol=0)
    with pytest.raises(AssertionError):
        assert_within_ulps(np.array([0x0001], np.uint16), np.array([0x8001], np.uint16), atol=0)
    # 1.0 vs 1.0 + 2 ulp (bf16), with and without an absolute floor that covers it
    with pytest.raises(AssertionError):
        assert_within_ulps(np.array([0x3F82], np.uint16), np.array([0x3F80], np.uint16))
    assert_within_ulps(np.array([0x3F82], np.uint16), np.array([0x3F80], np.uint16), atol=0.02)
    assert_within_ulps(np.array([2.0], np.float16), np.array([2.002], np.float16))


def test_first_bias_corrected_step_moves_by_lr_times_sign():
    g = np.array([0.5, -2.0, 3.0])
    ref = AdamReference([np.zeros(3)], [Hyper(lr=0.01, eps=1e-12)])
    ref.step([g])
    np.testing.assert_allclose(ref.p[0], -0.01 * np.sign(g), rtol=1e-6)


def test_decoupled_decay_shrinks_params_without_gradient():
    ref = AdamReference([np.full(2, 2.0)], [Hyper(lr=0.1, weight_decay=0.5)])
    ref.step([np.zeros(2)])
    np.testing.assert_allclose(ref.p[0], 2.0 * (1 - 0.05), rtol=1e-6)


def test_scaler_without_overflow_grows_every_window():
    s = LossScalerReference(initial_scale_power=2, window=2)
    assert [s.update(False) for _ in range(6)] == [4, 8, 8, 16, 16, 32]


def test_scaler_halves_after_hysteresis_and_floors():
    s = LossScalerReference(initial_scale_power=2, window=100, hysteresis=2, min_scale=1)
    assert [s.update(True) for _ in range(5)] == [4, 2, 1, 1, 1]
