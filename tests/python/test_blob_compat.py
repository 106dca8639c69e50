"""State blobs keep each parameter's step count, the groups' betas, eps
and weight decay, and the divergence check's state; blobs written before
those sections existed still load (each parameter then takes its group's
step count, the hyperparameters stay the config's, the divergence check
starts over)."""

import struct
import zlib

import numpy as np
import pytest

import dsopt

CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.05}},
          "param_groups": [{}, {"lr": 0.003, "betas": [0.8, 0.95]}], "threads": 1}
NEW_SECTIONS = ("common.param_steps", "common.hyper", "common.divergence")


def make(seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(n).astype(np.float32) for n in (33, 7, 100)]
    return params, dsopt.Optimizer(CONFIG, params, groups=[0, 1, 1])


def grads(step, absent=()):
    rng = np.random.default_rng(100 + step)
    out = [rng.standard_normal(n).astype(np.float32) for n in (33, 7, 100)]
    return [None if i in absent else g for i, g in enumerate(out)]


def resumed(params, blob):
    """A fresh optimizer over copies of `params` (the caller's fp32 values)
    that loads `blob`."""
    params2, opt2 = make(seed=1)
    for p, q in zip(params2, params):
        p[...] = q
    opt2.load_state_dict(blob)
    return params2, opt2


def continue_identically(params, opt, params2, opt2, steps):
    for k in steps:
        opt.step(grads(k))
        opt2.step(grads(k))
    for p, q in zip(params, params2):
        np.testing.assert_array_equal(p, q)
    opt.close()
    opt2.close()


def sections(blob: bytes):
    """(prefix before the section count, [(name, bytes)]) of a blob."""
    pos = 24
    (alg_len,) = struct.unpack_from("<I", blob, pos)
    pos += 4 + alg_len + 8
    (count,) = struct.unpack_from("<Q", blob, pos)
    pos += 8 + 16 * count
    prefix = blob[:pos]
    (n,) = struct.unpack_from("<I", blob, pos)
    pos += 4
    out = []
    for _ in range(n):
        (name_len,) = struct.unpack_from("<I", blob, pos)
        name = blob[pos + 4:pos + 4 + name_len].decode()
        pos += 4 + name_len
        (size,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        out.append((name, blob[pos:pos + size]))
        pos += size
    assert pos + 4 == len(blob)
    return prefix, out


def pack(prefix: bytes, parts) -> bytes:
    body = bytearray(prefix) + struct.pack("<I", len(parts))
    for name, data in parts:
        body += struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(data)) + data
    struct.pack_into("<Q", body, 16, len(body) + 4)
    return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))


def test_a_blob_without_the_new_sections_loads_and_continues_identically():
    params, opt = make()
    for k in range(4):
        opt.step(grads(k))
    blob = opt.state_dict()
    prefix, parts = sections(blob)
    assert {name for name, _ in parts} >= set(NEW_SECTIONS)
    assert pack(prefix, parts) == blob  # the re-packing itself is faithful
    old = pack(prefix, [(n, d) for n, d in parts if n not in NEW_SECTIONS])

    params2, opt2 = resumed(params, old)
    assert [opt2.param_step(i) for i in range(3)] == [4, 4, 4]
    assert opt2.get_group_param(1, "beta1") == pytest.approx(0.8)
    continue_identically(params, opt, params2, opt2, range(4, 8))


def test_param_steps_and_changed_hyperparameters_travel_in_the_blob():
    params, opt = make()
    opt.step(grads(0))
    opt.step(grads(1, absent={2}))
    opt.set_group_param(1, "beta1", 0.7)
    opt.set_group_param(0, "eps", 1e-6)
    opt.set_group_param(1, "weight_decay", 0.2)
    blob = opt.state_dict()
    params2, opt2 = resumed(params, blob)
    assert [opt2.param_step(i) for i in range(3)] == [2, 2, 1]
    assert opt2.get_group_param(1, "beta1") == 0.7
    assert opt2.get_group_param(0, "eps") == 1e-6
    assert opt2.get_group_param(1, "weight_decay") == 0.2
    continue_identically(params, opt, params2, opt2, range(2, 5))


def test_a_negative_param_step_in_a_blob_is_rejected_and_changes_nothing():
    params, opt = make()
    opt.step(grads(0))
    blob = opt.state_dict()
    prefix, parts = sections(blob)
    bad = [(n, struct.pack("<3q", 1, -5, 1) if n == "common.param_steps" else d) for n, d in parts]
    before = opt.state_dict()
    with pytest.raises(dsopt.CorruptState, match="negative step"):
        opt.load_state_dict(pack(prefix, bad))
    assert opt.state_dict() == before
    opt.close()
