"""dsopt.Codec (dsopt_codec) against the independent numpy reference of
compressed ZeRO's codes (compressed_zero_reference.py, written from the
guide): the same bytes for every codec, block size and run length, the
residual of error feedback over several encodings, the decoded runs summed
in run order, bf16 rounding, non-finite and huge values; torch tensors as
well as numpy arrays (CUDA ones where a GPU is there)."""

import numpy as np
import pytest

import dsopt
import compressed_zero_reference as ref

F32 = np.float32
BLOCKED = ("int8", "int4", "sign")


def values(rng, n):
    """Random fp32 values with a scale that changes from element to element
    and some exact zeros (never all zeros)."""
    x = rng.standard_normal(n) * np.exp(rng.uniform(-6, 6, n))
    x[rng.random(n) < 0.05] = 0.0
    x[0] = 1.0 + rng.random()
    return x.astype(F32)


def runs_of(x, runs):
    return np.split(x, runs)


@pytest.mark.parametrize("name", BLOCKED)
@pytest.mark.parametrize("block,n,runs", [(8, 1, 1), (8, 61, 3), (64, 1000, 2), (256, 300, 4), (64, 64, 1)])
def test_codes_are_the_reference_codes(rng, name, block, n, runs):
    codec = dsopt.Codec(name, block=block, threads=1)
    x = values(rng, n * runs)
    codes = codec.encode(x, runs=runs)
    assert codec.encoded_size(n) == ref.run_bytes(name, block, n)
    expected = b"".join(ref.encode(name, block, r)[0] for r in runs_of(x, runs))
    assert codes.tobytes() == expected
    total = codec.decode_sum(codes, n=n, runs=runs)
    decoded = [ref.decode(name, block, ref.encode(name, block, r)[0], n) for r in runs_of(x, runs)]
    acc = decoded[0]
    for d in decoded[1:]:
        acc = (acc + d).astype(F32)
    np.testing.assert_array_equal(total, acc)


@pytest.mark.parametrize("name", BLOCKED)
def test_error_feedback_keeps_the_reference_residual(rng, name):
    block, n, runs = 64, 200, 2
    codec = dsopt.Codec(name, block=block)
    residual = np.zeros(runs * codec.residual_size(n), np.uint8)
    assert codec.residual_size(n) == ref.run_bytes("int8", block, n)
    e = [np.zeros(n, F32) for _ in range(runs)]
    for step in range(4):
        g = values(rng, n * runs)
        codes = codec.encode(g, runs=runs, residual=residual)
        expected_codes, expected_residual = b"", b""
        previous = [ej.copy() for ej in e]
        for j, gj in enumerate(runs_of(g, runs)):
            x = (gj + e[j]).astype(F32)
            code, d = ref.encode(name, block, x)
            lost_code, e[j] = ref.encode("int8", block, (x - d).astype(F32))
            expected_codes += code
            expected_residual += lost_code
        assert codes.tobytes() == expected_codes, f"step {step}"
        assert residual.tobytes() == expected_residual, f"step {step}"
        # the residual decodes (as an int8 code) to the reference's
        # error-feedback values
        _, e_ref = ref.with_feedback(name, block, runs_of(g, runs)[-1], previous[-1])
        decoded = dsopt.Codec("int8", block=block).decode_sum(residual[-len(lost_code):], n=n)
        np.testing.assert_array_equal(decoded, e[-1])
        np.testing.assert_array_equal(decoded, e_ref)


def test_bf16_is_round_to_nearest_even(rng):
    codec = dsopt.Codec("bf16")
    x = values(rng, 1001)
    x[5], x[6] = np.float32(3.4e38), np.float32(-1e-40)
    codes = codec.encode(x, runs=1)
    assert codec.encoded_size(1001) == 2002
    np.testing.assert_array_equal(codes.view(np.uint16), ref.bf16_round(x).view(np.uint32) >> 16)
    two = codec.encode(np.concatenate([x, -x]), runs=2)
    total = codec.decode_sum(two, n=1001, runs=2)
    with np.errstate(invalid="ignore"):  # x[5] rounds to Inf: Inf + -Inf
        np.testing.assert_array_equal(total, (ref.bf16_round(x) + ref.bf16_round(-x)).astype(F32))
    with pytest.raises(dsopt.Unsupported, match="residual"):
        codec.residual_size(10)


@pytest.mark.parametrize("name", ("int8", "int4"))
def test_non_finite_and_huge_blocks(name):
    codec = dsopt.Codec(name, block=8)
    x = np.ones(24, F32)
    x[3] = np.nan
    x[8:16] = np.float32(3.4e38)
    x[16] = -np.inf
    codes = codec.encode(x)
    assert codes.tobytes() == ref.encode(name, 8, x)[0]
    d = codec.decode_sum(codes, n=24)
    assert np.isnan(d[:8]).all() and np.isnan(d[16:]).all()
    assert np.isfinite(d[8:16]).all()


def test_bad_arguments_raise_typed_errors():
    codec = dsopt.Codec("int4", block=8)
    with pytest.raises(dsopt.InvalidArgument, match="int2"):
        dsopt.Codec("int2")
    with pytest.raises(dsopt.InvalidArgument, match="block"):
        dsopt.Codec("int8", block=12)
    with pytest.raises(dsopt.InvalidArgumentType):
        codec.encode(np.zeros(8, np.float64))
    with pytest.raises(dsopt.InvalidArgument, match="multiple"):
        codec.encode(np.ones(9, F32), runs=2)
    with pytest.raises(dsopt.BufferTooSmall):
        codec.encode(np.ones(16, F32), out=np.zeros(7, np.uint8))
    residual = np.full(5, 3, np.uint8)
    with pytest.raises(dsopt.InvalidArgument, match="residual_size"):
        codec.encode(np.ones(16, F32), residual=residual)
    assert (residual == 3).all()
    codec.close()
    with pytest.raises(dsopt.InvalidArgument, match="closed"):
        codec.encoded_size(8)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_tensors_give_the_same_bytes(rng, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU: the CUDA codec runs with the GPU suite")
    codec = dsopt.Codec("int4", block=64, device=device)
    x = values(rng, 640)
    residual = torch.zeros(2 * codec.residual_size(320), dtype=torch.uint8, device=device)
    codes = codec.encode(torch.from_numpy(x).to(device), runs=2, residual=residual)
    assert codes.device.type == device and codes.dtype == torch.uint8
    host = dsopt.Codec("int4", block=64)
    host_residual = np.zeros(residual.numel(), np.uint8)
    assert codes.cpu().numpy().tobytes() == host.encode(x, runs=2, residual=host_residual).tobytes()
    assert residual.cpu().numpy().tobytes() == host_residual.tobytes()
    total = codec.decode_sum(codes, n=320, runs=2)
    np.testing.assert_array_equal(total.cpu().numpy(), host.decode_sum(codes.cpu().numpy(), n=320, runs=2))
