"""Shared helpers for the dsopt tests: configs, random data, comparisons."""

import re

import numpy as np

import dsopt
from adam_reference import AdamReference, Hyper

FP32_RTOL = 1e-5
FP32_ATOL = 1e-6


def build_feature(key: str) -> str:
    """Value of ``key`` in dsopt_build_info() ("off" when missing)."""
    pairs = dict(re.findall(r"(\w+)=(.*?)(?= \w+=|$)", dsopt.build_info()))
    return pairs.get(key, "off")


def skip_unless_mpi_runs(missing):
    """Skips the caller when runs under mpirun cannot happen here: `missing`
    (training_runs.mpi_available()'s reason, or "") or a library built
    without MPI."""
    import pytest

    if missing:
        pytest.skip(missing)
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")


def mpi4py_missing() -> str:
    """Why this Python cannot run ranks under mpirun with mpi4py ("" when it can)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin)"
    if subprocess.run([sys.executable, "-c", "from mpi4py import MPI"],
                      capture_output=True).returncode:
        return (f"mpi4py cannot load MPI for {sys.executable} (Debian: apt-get install "
                f"python3-mpi4py)")
    if build_feature("mpi") == "off":
        return "libdsopt was built without MPI"
    return ""


def assert_load_rejected(opt, params, blob, error, match):
    """opt.load_state_dict(blob) raises `error` matching `match`, and
    neither the optimizer's state nor the parameters change."""
    import pytest

    before, values = opt.state_dict(), [p.copy() for p in params]
    with pytest.raises(error, match=match):
        opt.load_state_dict(blob)
    assert opt.state_dict() == before
    for p, q in zip(params, values):
        np.testing.assert_array_equal(p, q)


def adam_config(opt_type="AdamW", **params) -> dict:
    config = {"optimizer": {"type": opt_type, "params": params}}
    return config


def with_keys(config: dict, **top_level) -> dict:
    out = dict(config)
    out.update(top_level)
    return out


def random_params(rng, sizes, dtype=np.float32):
    return [rng.standard_normal(n).astype(dtype) for n in sizes]


def random_grads(rng, sizes, scale=1.0):
    """fp32 gradients, a different magnitude per tensor."""
    return [
        (rng.standard_normal(n) * scale * (0.5 + i % 3)).astype(np.float32)
        for i, n in enumerate(sizes)
    ]


def hyper_from(params: dict) -> Hyper:
    h = Hyper()
    for key in ("lr", "eps", "weight_decay"):
        if key in params:
            setattr(h, key, params[key])
    if "betas" in params:
        h.beta1, h.beta2 = params["betas"]
    return h


def reference_for(config: dict, params, group_of=None) -> AdamReference:
    """An AdamReference configured like ``config`` (Adam/AdamW part)."""
    opt = config["optimizer"]
    p = opt.get("params", {})
    base = hyper_from(p)
    groups = [base]
    if "param_groups" in config:
        groups = []
        for overrides in config["param_groups"]:
            merged = dict(vars(base))
            merged.update({k: v for k, v in overrides.items() if k != "betas"})
            h = Hyper(**merged)
            if "betas" in overrides:
                h.beta1, h.beta2 = overrides["betas"]
            groups.append(h)
    decoupled = opt["type"].lower() == "adamw" or p.get("adam_w_mode", True)
    return AdamReference(
        [np.asarray(x, dtype=np.float64) for x in params], groups, group_of,
        decoupled=decoupled, bias_correction=p.get("bias_correction", True),
    )


def assert_fp32_close(actual, expected, what="params"):
    np.testing.assert_allclose(
        np.asarray(actual, dtype=np.float64).ravel(), np.asarray(expected, dtype=np.float64).ravel(),
        rtol=FP32_RTOL, atol=FP32_ATOL, err_msg=what,
    )


def assert_moved(before, after, what="params"):
    """Guards against vacuous comparisons: the values really changed."""
    delta = np.max(np.abs(np.asarray(after, np.float64) - np.asarray(before, np.float64)))
    assert delta > 100 * FP32_ATOL, f"{what} did not move (max change {delta})"


def run_fp32(config, params, grads_per_step, *, groups=None, group_of=None, on_step=None):
    """Steps an optimizer and its reference side by side; returns both."""
    initial = [p.copy() for p in params]
    ref = reference_for(config, params, group_of if group_of is not None else groups)
    with dsopt.Optimizer(config, params, groups=groups) as opt:
        for k, grads in enumerate(grads_per_step):
            if on_step:
                on_step(k, opt, ref)
            info = opt.step(grads)
            ref.step(grads)
            assert not info.skipped
            assert info.step == k + 1
    for i, p in enumerate(params):
        assert_fp32_close(p, ref.p[i], what=f"param {i} (numel {p.size})")
    assert_moved(np.concatenate(initial), np.concatenate(params))
    return ref
