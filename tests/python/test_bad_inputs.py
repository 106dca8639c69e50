"""Every bad input raises the DsoptError subclass for its status, with a
message naming the problem, and changes nothing."""

import numpy as np
import pytest

import dsopt
from dsopt_testing import adam_config, random_grads

SIZES = [7, 33]


def base_config():
    return adam_config("AdamW", lr=1e-3, weight_decay=0.01)


def modified(path, value):
    config = base_config()
    node = config
    *parents, last = path
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return config


BAD_CONFIGS = [
    # (id, config, exception, text the message must contain)
    ("unknown_key", modified(("optimizer", "params", "freze_step"), 100),
     dsopt.InvalidArgument, "optimizer.params.freze_step"),
    ("unknown_top_level_key", modified(("gradient_clip",), 1.0),
     dsopt.InvalidArgument, "gradient_clip"),
    ("unknown_fp16_key", modified(("fp16", "scale_window"), 10),
     dsopt.InvalidArgument, "fp16.scale_window"),
    ("lr_is_a_string", modified(("optimizer", "params", "lr"), "0.1"),
     dsopt.InvalidArgument, "optimizer.params.lr"),
    ("betas_not_a_list", modified(("optimizer", "params", "betas"), 0.9),
     dsopt.InvalidArgument, "betas"),
    ("betas_of_three", modified(("optimizer", "params", "betas"), [0.9, 0.99, 0.5]),
     dsopt.InvalidArgument, "betas"),
    ("bias_correction_not_bool", modified(("optimizer", "params", "bias_correction"), 1),
     dsopt.InvalidArgument, "bias_correction"),
    ("fp16_enabled_not_bool", modified(("fp16", "enabled"), "yes"),
     dsopt.InvalidArgument, "fp16.enabled"),
    ("window_not_integer", modified(("fp16", "loss_scale_window"), 2.5),
     dsopt.InvalidArgument, "fp16.loss_scale_window"),
    ("negative_lr", modified(("optimizer", "params", "lr"), -1e-3),
     dsopt.InvalidArgument, "optimizer.params.lr"),
    ("beta1_is_one", modified(("optimizer", "params", "betas"), [1.0, 0.999]),
     dsopt.InvalidArgument, "betas"),
    ("beta2_above_one", modified(("optimizer", "params", "betas"), [0.9, 1.5]),
     dsopt.InvalidArgument, "betas"),
    ("negative_beta", modified(("optimizer", "params", "betas"), [-0.1, 0.999]),
     dsopt.InvalidArgument, "betas"),
    ("zero_eps", modified(("optimizer", "params", "eps"), 0.0),
     dsopt.InvalidArgument, "optimizer.params.eps"),
    ("negative_eps", modified(("optimizer", "params", "eps"), -1e-8),
     dsopt.InvalidArgument, "optimizer.params.eps"),
    ("negative_weight_decay", modified(("optimizer", "params", "weight_decay"), -0.1),
     dsopt.InvalidArgument, "weight_decay"),
    ("group_negative_lr", dict(base_config(), param_groups=[{"lr": -1.0}]),
     dsopt.InvalidArgument, "param_groups[0].lr"),
    ("group_unknown_key", dict(base_config(), param_groups=[{"momentum": 0.9}]),
     dsopt.InvalidArgument, "param_groups[0].momentum"),
    ("unknown_optimizer_type", modified(("optimizer", "type"), "Adagrad"),
     dsopt.InvalidArgument, "Adagrad"),
    ("missing_optimizer", {"gradient_clipping": 1.0},
     dsopt.InvalidArgument, "optimizer"),
    ("amsgrad_true", modified(("optimizer", "params", "amsgrad"), True),
     dsopt.InvalidArgument, "amsgrad"),
    ("adamw_with_l2_mode", modified(("optimizer", "params", "adam_w_mode"), False),
     dsopt.InvalidArgument, "adam_w_mode"),
    ("fp16_and_bf16", dict(base_config(), fp16={"enabled": True}, bf16={"enabled": True}),
     dsopt.InvalidArgument, "bf16"),
    ("negative_clipping", dict(base_config(), gradient_clipping=-1.0),
     dsopt.InvalidArgument, "gradient_clipping"),
    ("bad_device", dict(base_config(), device="tpu"),
     dsopt.InvalidArgument, "device"),
    # Integers that only fit after truncation to 32 bits must not be taken as
    # their low bits (2**32 + 1 would become 1).
    ("initial_scale_power_beyond_int32", dict(base_config(), fp16={"initial_scale_power": 2**32 + 1}),
     dsopt.InvalidArgument, "fp16.initial_scale_power"),
    ("hysteresis_beyond_int32", dict(base_config(), fp16={"hysteresis": 2**32 + 2}),
     dsopt.InvalidArgument, "fp16.hysteresis"),
    ("threads_beyond_int32", dict(base_config(), threads=2**32 + 1),
     dsopt.InvalidArgument, "threads"),
    ("negative_threads", dict(base_config(), threads=-1),
     dsopt.InvalidArgument, "threads"),
    ("negative_max_consecutive_skips", dict(base_config(), max_consecutive_skips=-1),
     dsopt.InvalidArgument, "max_consecutive_skips"),
    ("fractional_max_consecutive_skips", dict(base_config(), max_consecutive_skips=1.5),
     dsopt.InvalidArgument, "max_consecutive_skips"),
    ("max_consecutive_skips_is_a_string", dict(base_config(), max_consecutive_skips="x"),
     dsopt.InvalidArgument, "max_consecutive_skips"),
    ("stabilize_not_bool", {"optimizer": {"type": "OneBitAdam", "params": {"stabilize": "yes"}}},
     dsopt.InvalidArgument, "optimizer.params.stabilize"),
    ("zero_stabilize_limit",
     {"optimizer": {"type": "OneBitAdam", "params": {"stabilize_limit": 0.0}}},
     dsopt.InvalidArgument, "optimizer.params.stabilize_limit"),
]


@pytest.mark.parametrize("config, error, text", [c[1:] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_is_rejected_by_name(rng, config, error, text):
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    before = [p.copy() for p in params]
    with pytest.raises(error) as excinfo:
        dsopt.Optimizer(config, params)
    assert text in str(excinfo.value)
    assert excinfo.value.status == error.status
    assert all(np.array_equal(p, b) for p, b in zip(params, before))


def test_absurd_thread_count_fails_cleanly():
    # Run in a child: a crash must fail this test, not the whole session.
    import subprocess
    import sys

    import conftest

    code = (
        "import numpy as np, dsopt\n"
        "p = [np.ones(64, np.float32)]\n"
        "try:\n"
        "    with dsopt.Optimizer({'optimizer': {'type': 'AdamW'}, 'threads': 100000}, p) as o:\n"
        "        o.step([np.ones(64, np.float32)])\n"
        "    print('stepped', float(p[0][0]))\n"
        "except dsopt.InvalidArgument as e:\n"
        "    print('rejected', e)\n"
    )
    env = {"PYTHONPATH": str(conftest.BINDING_DIR), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert proc.stdout.startswith("stepped 0.999") or (
        proc.stdout.startswith("rejected") and "threads" in proc.stdout), proc.stdout


def test_invalid_json_text_is_rejected(rng):
    params = [rng.standard_normal(7).astype(np.float32)]
    with pytest.raises(dsopt.InvalidArgument, match="JSON"):
        dsopt.Optimizer('{"optimizer": {"type": "AdamW"', params)


def test_unknown_optimizer_type_names_the_known_ones(rng):
    params = [rng.standard_normal(7).astype(np.float32)]
    with pytest.raises(dsopt.InvalidArgument, match="OneBitLamb, ZeroOneAdam"):
        dsopt.Optimizer(modified(("optimizer", "type"), "ZeroTwoAdam"), params)


def test_group_index_out_of_range_is_rejected(rng):
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    config = dict(base_config(), param_groups=[{"lr": 1e-2}, {"lr": 1e-3}])
    with pytest.raises(dsopt.InvalidArgument, match="group"):
        dsopt.Optimizer(config, params, groups=[0, 2])


def test_no_parameters_is_rejected():
    with pytest.raises(dsopt.InvalidArgument):
        dsopt.Optimizer(base_config(), [])


def test_parameters_sharing_storage_are_rejected_naming_both(rng):
    """The same array twice, or overlapping views of one buffer, would be
    updated twice per step (torch.optim refuses duplicates too); adjacent
    views are fine. At create and at rebind; a rejected rebind changes
    nothing."""
    a = rng.standard_normal(40).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    with pytest.raises(dsopt.InvalidArgument, match=r"params\[0\] and params\[2\] share storage"):
        dsopt.Optimizer(base_config(), [a, b, a])
    with pytest.raises(dsopt.InvalidArgument, match=r"params\[0\] and params\[1\] share storage"):
        dsopt.Optimizer(base_config(), [a[:25], a[20:]])
    with dsopt.Optimizer(base_config(), [a[:20], a[20:]]) as opt:  # adjacent
        opt.step(random_grads(rng, [20, 20]))
        other = rng.standard_normal(40).astype(np.float32)
        with pytest.raises(dsopt.InvalidArgument, match=r"params\[0\] and params\[1\] share storage"):
            opt.rebind_params([other[:20], other[:20]])
        before = a.copy()
        opt.step(random_grads(rng, [20, 20]))
        assert not np.array_equal(a, before)  # still stepping the old buffers


# ---- failures on a live optimizer leave it as it was ----------------------


class Live:
    """An optimizer a few steps in, with a twin that never sees the failures."""

    def __init__(self, rng, dtype, config=None, sizes=SIZES):
        self.rng = rng
        self.sizes = sizes
        self.dtype = dtype
        config = config or base_config()
        self.params = [rng.standard_normal(n).astype(dtype) for n in sizes]
        self.twin_params = [p.copy() for p in self.params]
        self.opt = dsopt.Optimizer(config, self.params)
        self.twin = dsopt.Optimizer(config, self.twin_params)
        for _ in range(3):
            self.step_both()
        self.blob = self.opt.state_dict()
        self.saved = [p.copy() for p in self.params]

    def step_both(self):
        grads = random_grads(self.rng, self.sizes)
        a = self.opt.step(grads)
        b = self.twin.step(grads)
        assert a == b

    def assert_unchanged(self):
        assert all(np.array_equal(p, s) for p, s in zip(self.params, self.saved))
        assert self.opt.state_dict() == self.blob
        for _ in range(2):
            self.step_both()
        for p, q in zip(self.params, self.twin_params):
            assert np.array_equal(p, q)

    def close(self):
        self.opt.close()
        self.twin.close()


@pytest.fixture(params=[np.float32, np.float16], ids=["fp32_params", "fp16_params"])
def live(rng, request):
    state = Live(rng, request.param)
    yield state
    state.close()


def good_grads(live):
    return random_grads(live.rng, live.sizes)


def test_wrong_gradient_count_is_rejected(live):
    with pytest.raises(dsopt.InvalidArgument, match="grad"):
        live.opt.step(good_grads(live)[:1])
    with pytest.raises(dsopt.InvalidArgument, match="grad"):
        live.opt.step(good_grads(live) + [np.ones(3, np.float32)])
    live.assert_unchanged()


def test_wrong_gradient_numel_is_rejected(live):
    grads = good_grads(live)
    grads[1] = np.ones(grads[1].size + 1, np.float32)
    with pytest.raises(dsopt.InvalidArgument, match="numel|elements|size"):
        live.opt.step(grads)
    live.assert_unchanged()


def test_unsupported_gradient_dtype_is_rejected_by_the_binding(live):
    grads = good_grads(live)
    grads[0] = grads[0].astype(np.float64)
    with pytest.raises(dsopt.InvalidArgument, match="float64") as excinfo:
        live.opt.step(grads)
    assert isinstance(excinfo.value, TypeError)
    live.assert_unchanged()


def test_bad_gradient_dtype_code_is_rejected_by_the_library(live):
    from dsopt import ffi, lib

    grads = good_grads(live)
    tensors = ffi.new("dsopt_tensor[]", len(grads))
    for t, g in zip(tensors, grads):
        t.data = ffi.cast("void *", g.ctypes.data)
        t.numel = g.size
        t.dtype = 7
    rc = lib.dsopt_step(live.opt.handle, tensors, len(grads), ffi.NULL)
    assert rc == lib.DSOPT_EINVAL
    assert "dtype" in ffi.string(lib.dsopt_last_error()).decode()
    with pytest.raises(dsopt.InvalidArgument, match="dtype"):
        dsopt.check(rc)  # the message is still the last error of this thread
    live.assert_unchanged()


def test_negative_or_nan_lr_is_rejected(live):
    lr = live.opt.lr
    for bad in (-1e-3, float("nan"), float("inf")):
        with pytest.raises(dsopt.InvalidArgument, match="lr"):
            live.opt.lr = bad
        with pytest.raises(dsopt.InvalidArgument, match="lr"):
            live.opt.set_group_lr(0, bad)
    assert live.opt.lr == lr
    live.assert_unchanged()


def test_group_out_of_range_for_lr_calls_is_rejected(live):
    with pytest.raises(dsopt.InvalidArgument, match="group"):
        live.opt.set_group_lr(1, 1e-3)
    with pytest.raises(dsopt.InvalidArgument, match="group"):
        live.opt.get_group_lr(-1)
    live.assert_unchanged()


@pytest.mark.parametrize("cut", [0, 1, 8, 64, "half", "minus_one"])
def test_truncated_blob_is_corrupt(live, cut):
    n = len(live.blob)
    keep = {"half": n // 2, "minus_one": n - 1}.get(cut, cut)
    with pytest.raises(dsopt.CorruptState):
        live.opt.load_state_dict(live.blob[:keep])
    live.assert_unchanged()


def test_bit_flipped_blob_is_corrupt(live):
    n = len(live.blob)
    for position in sorted({0, 5, 17, n // 3, n // 2, n - 9, n - 1}):
        for bit in (0, 7):
            flipped = bytearray(live.blob)
            flipped[position] ^= 1 << bit
            with pytest.raises(dsopt.CorruptState):
                live.opt.load_state_dict(bytes(flipped))
    live.assert_unchanged()


def test_blob_with_trailing_bytes_is_rejected(live):
    with pytest.raises((dsopt.CorruptState, dsopt.Mismatch)):
        live.opt.load_state_dict(live.blob + b"\0" * 8)
    live.assert_unchanged()


def blob_of(config, sizes, rng, dtype=np.float32, steps=2):
    params = [rng.standard_normal(n).astype(dtype) for n in sizes]
    with dsopt.Optimizer(config, params) as opt:
        for _ in range(steps):
            opt.step(random_grads(rng, sizes))
        return opt.state_dict()


@pytest.mark.parametrize("other", ["sizes", "count", "dtype", "algorithm", "groups"])
def test_blob_of_another_shape_or_algorithm_is_a_mismatch(live, rng, other):
    if other == "sizes":
        blob = blob_of(base_config(), [7, 34], rng, dtype=live.dtype)
    elif other == "count":
        blob = blob_of(base_config(), [7, 33, 5], rng, dtype=live.dtype)
    elif other == "dtype":
        other_dtype = np.float16 if live.dtype == np.float32 else np.float32
        blob = blob_of(base_config(), SIZES, rng, dtype=other_dtype)
    elif other == "algorithm":
        l2 = adam_config("Adam", lr=1e-3, weight_decay=0.01, adam_w_mode=False)
        blob = blob_of(l2, SIZES, rng, dtype=live.dtype)
    else:
        blob = blob_of(dict(base_config(), param_groups=[{}, {}]), SIZES, rng, dtype=live.dtype)
    with pytest.raises(dsopt.Mismatch):
        live.opt.load_state_dict(blob)
    live.assert_unchanged()


def test_non_bytes_blob_is_a_type_error(live):
    with pytest.raises(TypeError):
        live.opt.load_state_dict("not bytes")
    live.assert_unchanged()
