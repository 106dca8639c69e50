"""16-bit float helpers for the references: fp16 via numpy, bf16 by hand."""

import numpy as np


def to_fp16(x) -> np.ndarray:
    """Round to fp16, nearest even (numpy's conversion from float32/float64)."""
    return np.asarray(x, dtype=np.float64).astype(np.float16)


def to_bf16_bits(x) -> np.ndarray:
    """Round float values to bfloat16 (nearest even); returns the uint16 bits.

    Rounds via float32 first, like the library (fp32 master -> bf16)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out


def bf16_bits_to_float(bits) -> np.ndarray:
    """Exact float32 values of bfloat16 bits."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def ordered(bits16: np.ndarray) -> np.ndarray:
    """Maps 16-bit float bit patterns to ints whose differences count ulps."""
    b = np.asarray(bits16).view(np.uint16).astype(np.int64)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def decode(values16) -> np.ndarray:
    """float64 values of an fp16 array or of uint16 bfloat16 bits."""
    a = np.asarray(values16)
    if a.dtype == np.float16:
        return a.astype(np.float64)
    return bf16_bits_to_float(a).astype(np.float64)


def assert_within_ulps(actual, expected, ulps=1, atol=1e-6, what="values"):
    """Both arguments are fp16 arrays or uint16 bf16 bit arrays. An element
    passes within ``ulps`` ulps, or within ``atol`` absolutely: near zero a
    16-bit ulp is far smaller than the fp32-vs-float64 master difference."""
    diff = np.abs(ordered(actual) - ordered(expected))
    far = (diff > ulps) & (np.abs(decode(actual) - decode(expected)) > atol)
    if np.any(far):
        i = int(np.argmax(np.where(far, diff, -1)))
        a_bits = np.asarray(actual).view(np.uint16).ravel()
        e_bits = np.asarray(expected).view(np.uint16).ravel()
        raise AssertionError(
            f"{what}: {np.count_nonzero(far)} of {diff.size} elements differ by more than "
            f"{ulps} ulp and {atol} (worst {int(diff.ravel()[i])} ulp at index {i}: bits "
            f"{a_bits[i]:#06x} = {decode(actual).ravel()[i]:.9g} vs expected {e_bits[i]:#06x} = "
            f"{decode(expected).ravel()[i]:.9g})"
        )
