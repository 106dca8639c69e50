"""The gradient descriptors kept from step to step: dsopt.Optimizer.step
describes only gradient objects that differ from the last step's (``is``),
dsopt.torch.Optimizer.step only ``.grad`` tensors that changed. Every
result must be bit for bit the one of an optimizer that describes every
gradient afresh at every step (``clear_grad_cache()`` before each step),
and every error the one it raises, with nothing changed.

The torch tests skip without torch; run them with a Python that has it
(`make test-torch`'s, or any torch >= 1.13)."""

import gc
import weakref

import numpy as np
import pytest

import dsopt
from dsopt import ffi
from dsopt.tensors import TENSOR_RECORD, tensor_records

try:
    import torch
    import dsopt.torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed for this Python")

CONFIG = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}
SIZES = (5, 1, 17, 64, 3, 9)
STEPS = 5


def bf16_bits(values):
    """float32 -> the upper 16 bits (bfloat16, truncated) as uint16."""
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def grad_values(rng, steps=STEPS):
    return [[rng.standard_normal(n).astype(np.float32) for n in SIZES] for _ in range(steps)]


def as_kind(values, i):
    """Gradient i as the binding takes it: float32, float16, bf16 tagged two
    ways, so that the cache meets every kind of object."""
    kind = i % 4
    if kind == 0:
        return values.copy()
    if kind == 1:
        return values.astype(np.float16)
    if kind == 2:
        return dsopt.bf16(bf16_bits(values))
    return (bf16_bits(values), "bfloat16")


def fill(dst, values, i):
    """Writes ``values`` into gradient object ``dst`` (made by as_kind)."""
    kind = i % 4
    if kind in (0, 1):
        dst[...] = values
    elif kind == 2:
        dst.array[...] = bf16_bits(values)
    else:
        dst[0][...] = bf16_bits(values)


def start_params(seed=7):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def reference(values_per_step, params=None):
    """The parameters after stepping with fresh gradient objects, described
    afresh at every step."""
    params = start_params() if params is None else params
    with dsopt.Optimizer(CONFIG, params) as opt:
        for values in values_per_step:
            opt.clear_grad_cache()
            opt.step([as_kind(v, i) for i, v in enumerate(values)])
    return params


def assert_bits_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert np.array_equal(a.view(np.uint8), e.view(np.uint8))


# ---- the record layout ---------------------------------------------------

def test_record_dtype_matches_the_c_struct():
    assert TENSOR_RECORD.itemsize == ffi.sizeof("dsopt_tensor")
    for name in ("data", "numel", "dtype", "group"):
        assert TENSOR_RECORD.fields[name][1] == ffi.offsetof("dsopt_tensor", name)
    c_array = ffi.new("dsopt_tensor[]", 3)
    records = tensor_records(c_array)
    records[1] = (0x1234, 77, 2, 5)
    assert int(ffi.cast("uintptr_t", c_array[1].data)) == 0x1234
    assert (c_array[1].numel, c_array[1].dtype, c_array[1].group) == (77, 2, 5)
    assert c_array[0].numel == 0 and c_array[2].numel == 0


# ---- dsopt.Optimizer.step with numpy arrays -------------------------------

def test_same_objects_every_step_match_fresh_objects(rng):
    values = grad_values(rng)
    params = start_params()
    grads = [as_kind(v, i) for i, v in enumerate(values[0])]
    with dsopt.Optimizer(CONFIG, params) as opt:
        for step_values in values:
            for i, v in enumerate(step_values):
                fill(grads[i], v, i)
            opt.step(grads)
    assert_bits_equal(params, reference(values))


def test_new_objects_every_step_match(rng):
    values = grad_values(rng)
    params = start_params()
    with dsopt.Optimizer(CONFIG, params) as opt:
        for step_values in values:
            opt.step([as_kind(v, i) for i, v in enumerate(step_values)])
    assert_bits_equal(params, reference(values))


def test_some_objects_replaced_each_step_match(rng):
    values = grad_values(rng, steps=8)
    params = start_params()
    grads = [as_kind(v, i) for i, v in enumerate(values[0])]
    with dsopt.Optimizer(CONFIG, params) as opt:
        for step, step_values in enumerate(values):
            replaced = set(rng.choice(len(SIZES), size=step % len(SIZES), replace=False))
            for i, v in enumerate(step_values):
                if i in replaced:
                    grads[i] = as_kind(v, i)
                else:
                    fill(grads[i], v, i)
            opt.step(list(grads))  # also a new list of (mostly) the same objects
    assert_bits_equal(params, reference(values))


def test_plain_float32_arrays_same_and_new(rng):
    """The vectorised path (every changed entry a plain float32/float16 array)."""
    sizes = [int(n) for n in rng.integers(1, 50, size=40)]
    values = [[rng.standard_normal(n).astype(np.float32) for n in sizes] for _ in range(4)]
    start = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    kept = [p.copy() for p in start]
    fresh = [p.copy() for p in start]
    grads = [v.copy() for v in values[0]]
    with dsopt.Optimizer(CONFIG, kept) as a, dsopt.Optimizer(CONFIG, fresh) as b:
        for step, step_values in enumerate(values):
            for g, v in zip(grads, step_values):
                g[...] = v
            if step == 2:
                grads[3] = step_values[3].astype(np.float16)
            a.step(grads)
            b.clear_grad_cache()
            b.step([g.copy() for g in grads])
    assert_bits_equal(kept, fresh)


def error_of(call):
    with pytest.raises(dsopt.DsoptError) as info:
        call()
    return type(info.value), str(info.value)


@pytest.mark.parametrize("bad", ["reordered", "shorter", "longer", "float64", "numel",
                                 "strided", "uint16", "not an array", "readonly fine"])
def test_bad_lists_raise_as_without_cache_and_change_nothing(rng, bad):
    values = grad_values(rng, steps=4)
    params = start_params()
    grads = [as_kind(v, i) for i, v in enumerate(values[0])]
    with dsopt.Optimizer(CONFIG, params) as opt:
        opt.step(grads)
        opt.step(grads)
        bad_list = list(grads)
        if bad == "reordered":
            bad_list[1], bad_list[2] = bad_list[2], bad_list[1]
        elif bad == "shorter":
            bad_list = bad_list[:-1]
        elif bad == "longer":
            bad_list = bad_list + [bad_list[0]]
        elif bad == "float64":
            bad_list[4] = values[1][4].astype(np.float64)
        elif bad == "numel":
            bad_list[4] = np.zeros(SIZES[4] + 1, np.float32)
        elif bad == "strided":
            bad_list[4] = np.zeros(2 * SIZES[4], np.float32)[::2]
        elif bad == "uint16":
            bad_list[4] = bf16_bits(values[1][4])  # untagged
        elif bad == "not an array":
            bad_list[4] = list(values[1][4])
        elif bad == "readonly fine":
            bad_list[4] = values[1][4].copy()
            bad_list[4].flags.writeable = False
        before = [p.copy() for p in params]
        with dsopt.Optimizer(CONFIG, start_params()) as fresh:
            if bad == "readonly fine":
                opt.step(bad_list)  # gradients need not be writable
                fresh.step(bad_list)
                return
            expected = error_of(lambda: fresh.step(bad_list))
        assert error_of(lambda: opt.step(bad_list)) == expected
        assert_bits_equal(params, before)
        for step_values in values[2:]:
            for i, v in enumerate(step_values):
                fill(grads[i], v, i)
            opt.step(grads)
    assert_bits_equal(params, reference(values[:1] * 2 + values[2:]))


def test_error_in_a_changed_entry_then_the_same_list_fixed(rng):
    """A failed update leaves the cache as it was: the entries before the
    bad one are not half-written."""
    values = grad_values(rng, steps=3)
    params = start_params()
    with dsopt.Optimizer(CONFIG, params) as opt:
        grads = [as_kind(v, i) for i, v in enumerate(values[0])]
        opt.step(grads)
        new = [as_kind(v, i) for i, v in enumerate(values[1])]
        new[5] = np.zeros(SIZES[5], np.float64)
        with pytest.raises(dsopt.InvalidArgumentType, match=r"grads\[5\]: unsupported dtype"):
            opt.step(new)
        new[5] = as_kind(values[1][5], 5)
        opt.step(new)
        opt.step([as_kind(v, i) for i, v in enumerate(values[2])])
    assert_bits_equal(params, reference(values))


def test_last_gradients_stay_referenced_until_replaced_or_cleared(rng):
    params = start_params()
    grads = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    ref = weakref.ref(grads[2])
    with dsopt.Optimizer(CONFIG, params) as opt:
        opt.step(grads)
        del grads
        gc.collect()
        assert ref() is not None  # its memory is what the kept descriptor points at
        other = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
        opt.step(other)
        gc.collect()
        assert ref() is None
        ref = weakref.ref(other[0])
        del other
        opt.clear_grad_cache()
        gc.collect()
        assert ref() is None
        opt.step([np.zeros(n, np.float32) for n in SIZES])  # steps normally after clearing


def test_kept_array_cannot_move_while_referenced(rng):
    params = start_params()
    grads = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    with dsopt.Optimizer(CONFIG, params) as opt:
        opt.step(grads)
        with pytest.raises(ValueError):
            grads[3].resize(1000)  # numpy refuses: the optimizer references it


def test_bf16_wrapper_keeps_its_array_alive(rng):
    params = start_params()
    values = grad_values(rng, steps=1)[0]
    grads = [v.copy() for v in values]
    wrapper = dsopt.bf16(bf16_bits(values[2]))
    grads[2] = wrapper
    ref = weakref.ref(wrapper.array)
    with dsopt.Optimizer(CONFIG, params) as opt:
        opt.step(grads)
        wrapper.array = bf16_bits(values[2])  # documented: pass a new object instead
        gc.collect()
        assert ref() is not None  # the described buffer is not freed under the descriptor
        opt.clear_grad_cache()
        gc.collect()
        assert ref() is None


def test_close_drops_the_references(rng):
    grads = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    ref = weakref.ref(grads[0])
    opt = dsopt.Optimizer(CONFIG, start_params())
    opt.step(grads)
    del grads
    opt.close()
    gc.collect()
    assert ref() is None


# ---- torch tensors through dsopt.Optimizer -------------------------------

@needs_torch
def test_torch_tensors_in_dsopt_optimizer_same_new_and_cleared(rng):
    values = grad_values(rng)
    params = [torch.from_numpy(p) for p in start_params()]
    grads = [torch.from_numpy(v.copy()) for v in values[0]]
    with dsopt.Optimizer(CONFIG, params) as opt:
        for step, step_values in enumerate(values):
            if step == 2:
                grads = [torch.from_numpy(v.copy()) for v in step_values]  # new objects
            elif step == 3:
                # Storage swapped in place: the documented case for clear_grad_cache().
                for g, v in zip(grads, step_values):
                    g.set_(torch.from_numpy(v.copy()))
                opt.clear_grad_cache()
            else:
                for g, v in zip(grads, step_values):
                    g.copy_(torch.from_numpy(v))
            opt.step(grads)
    expected = start_params()
    with dsopt.Optimizer(CONFIG, expected) as ref:
        for step_values in values:
            ref.step([v.copy() for v in step_values])
    assert_bits_equal([p.numpy() for p in params], expected)


# ---- dsopt.torch.Optimizer ------------------------------------------------

TORCH_SHAPES = ((4, 3), (7,), (1,), (3, 5), (2, 2, 2))


def torch_params(seed=3, dtype=None):
    gen = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    return [torch.nn.Parameter(torch.randn(*s, generator=gen).to(dtype)) for s in TORCH_SHAPES]


def torch_grads(step, params):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*p.shape, generator=gen).to(p.dtype) for p in params]


def run_torch(assign, steps=6, dtype=None, config=CONFIG, fresh_each_step=False):
    """Parameters after ``steps`` steps where ``assign(step, params, grads)``
    sets the .grad values (grads: that step's values)."""
    params = torch_params(dtype=dtype)
    opt = dsopt.torch.Optimizer(params, config)
    try:
        for step in range(steps):
            assign(step, params, torch_grads(step, params))
            if fresh_each_step:
                opt.clear_grad_cache()
            opt.step()
    finally:
        opt.close()
    return [p.detach().clone() for p in params]


def fresh_assign(step, params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()


def torch_reference(steps=6, dtype=None, config=CONFIG, assign=fresh_assign):
    return run_torch(assign, steps, dtype, config, fresh_each_step=True)


def assert_torch_bits_equal(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        bits = {2: torch.int16, 4: torch.int32}[a.element_size()]
        assert torch.equal(a.detach().view(bits), e.detach().view(bits))


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_grads_kept_in_place_match(dtype):
    dtype = getattr(torch, dtype)

    def in_place(step, params, grads):
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)  # the same .grad object every step

    assert_torch_bits_equal(run_torch(in_place, dtype=dtype), torch_reference(dtype=dtype))


@needs_torch
def test_torch_new_grads_every_step_match():
    assert_torch_bits_equal(run_torch(fresh_assign), torch_reference())


@needs_torch
def test_torch_mix_of_kept_new_and_missing_grads_match():
    def mixed(step, params, grads):
        for i, (p, g) in enumerate(zip(params, grads)):
            rule = (i + step) % 4
            if rule == 0 or p.grad is None:
                p.grad = None if rule == 3 else g.clone()
            elif rule == 1:
                p.grad.copy_(g)
            elif rule == 2:
                p.grad = g.clone()
            else:
                p.grad = None  # steps with zeros

    assert_torch_bits_equal(run_torch(mixed, steps=9), torch_reference(steps=9, assign=mixed))


@needs_torch
def test_torch_some_grads_replaced_while_the_old_ones_live_match():
    """Only the replaced entries are described again (the old gradients
    stay alive, so no reference to them dies)."""
    alive = []

    def some_replaced(step, params, grads):
        for i, (p, g) in enumerate(zip(params, grads)):
            if p.grad is None or (i + step) % 3 == 0:
                alive.append(p.grad)
                p.grad = g.clone()
            elif (i + step) % 3 == 1:
                p.grad.copy_(g)
            else:
                alive.append(p.grad)
                p.grad = None if step % 2 else g.clone()

    assert_torch_bits_equal(run_torch(some_replaced, steps=8),
                            torch_reference(steps=8, assign=some_replaced))


@needs_torch
def test_torch_grad_dropped_then_none_steps_with_zeros():
    """A described .grad that is dropped (freed) and left None steps with
    zeros, not with the freed tensor's memory."""
    def drop_some(step, params, grads):
        for i, (p, g) in enumerate(zip(params, grads)):
            if i == 0 and step % 2 == 1:
                p.grad = None  # the tensor of the last step is freed
            elif p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)

    assert_torch_bits_equal(run_torch(drop_some), torch_reference(assign=drop_some))


@needs_torch
def test_torch_non_contiguous_grad_is_copied_every_step():
    def transposed(step, params, grads):
        for i, (p, g) in enumerate(zip(params, grads)):
            if p.dim() == 2 and p.shape[0] != p.shape[1]:
                if p.grad is None:
                    p.grad = g.t().contiguous().t()  # same shape, not contiguous
                else:
                    p.grad.copy_(g)  # same object, new values in place
                assert not p.grad.is_contiguous()
            else:
                p.grad = g.clone()

    assert_torch_bits_equal(run_torch(transposed), torch_reference(assign=transposed))


@needs_torch
def test_torch_grads_are_not_kept_alive():
    params = torch_params()
    opt = dsopt.torch.Optimizer(params, CONFIG)
    fresh_assign(0, params, torch_grads(0, params))
    opt.step()
    ref = weakref.ref(params[0].grad)
    opt.zero_grad(set_to_none=True)
    gc.collect()
    assert ref() is None  # freed as without dsopt's descriptors
    fresh_assign(1, params, torch_grads(1, params))
    opt.step()
    opt.close()


def torch_error(opt):
    with pytest.raises(Exception) as info:
        opt.step()
    return type(info.value), str(info.value)


@needs_torch
@pytest.mark.parametrize("bad", ["sparse", "numel via .data", "float64 via .data",
                                 "float16 via .data"])
def test_torch_changed_grad_checked_as_without_cache(bad):
    """A new .grad object is checked as when every gradient is described:
    the same error and nothing changed, or (float16, which dsopt takes for
    a float32 parameter) the same step."""
    def make_bad(params):
        p = params[1]
        if bad == "sparse":
            p.grad = torch.zeros(p.shape).to_sparse()
            return
        g = torch.zeros(p.shape)
        p.grad = g  # torch checks the assignment...
        if bad == "numel via .data":  # ...but not a later swap of the data
            g.data = torch.zeros(p.numel() + 2)
        elif bad == "float16 via .data":
            g.data = torch.full(p.shape, 0.5, dtype=torch.float16)
        else:
            g.data = torch.zeros(p.shape, dtype=torch.float64)

    params = torch_params()
    opt = dsopt.torch.Optimizer(params, CONFIG)
    expected_params = torch_params()
    expected_opt = dsopt.torch.Optimizer(expected_params, CONFIG)
    try:
        for step in range(2):
            fresh_assign(step, params, torch_grads(step, params))
            opt.step()
            fresh_assign(step, expected_params, torch_grads(step, expected_params))
            expected_opt.step()
        before = [p.detach().clone() for p in params]
        make_bad(params)
        make_bad(expected_params)
        expected_opt.clear_grad_cache()
        if bad == "float16 via .data":
            expected_opt.step()
            opt.step()
        else:
            expected = torch_error(expected_opt)
            assert torch_error(opt) == expected
            assert_torch_bits_equal([p.detach() for p in params], before)
        for step in range(2, 4):
            fresh_assign(step, params, torch_grads(step, params))
            opt.step()
            fresh_assign(step, expected_params, torch_grads(step, expected_params))
            expected_opt.clear_grad_cache()
            expected_opt.step()
        assert_torch_bits_equal([p.detach() for p in params],
                                [p.detach() for p in expected_params])
    finally:
        opt.close()
        expected_opt.close()


@needs_torch
def test_torch_storage_swapped_in_place_needs_clear_grad_cache():
    def swapped(step, params, grads):
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.set_(g.clone())  # same object, other storage

    params = torch_params()
    opt = dsopt.torch.Optimizer(params, CONFIG)
    try:
        for step in range(5):
            swapped(step, params, torch_grads(step, params))
            opt.clear_grad_cache()
            opt.step()
    finally:
        opt.close()
    assert_torch_bits_equal([p.detach() for p in params], torch_reference(steps=5))


@needs_torch
def test_torch_training_loop_zero_grad_both_ways_matches():
    def loop(set_to_none, clear):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 1))
        opt = dsopt.torch.Optimizer(model.parameters(), CONFIG)
        gen = torch.Generator().manual_seed(5)
        for _ in range(6):
            x = torch.randn(16, 8, generator=gen)
            opt.zero_grad(set_to_none=set_to_none)
            model(x).pow(2).mean().backward()
            if clear:
                opt.clear_grad_cache()
            opt.step()
        opt.close()
        return [p.detach().clone() for p in model.parameters()]

    expected = loop(True, True)
    assert_torch_bits_equal(loop(True, False), expected)
    assert_torch_bits_equal(loop(False, False), expected)
