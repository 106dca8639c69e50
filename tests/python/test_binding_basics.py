"""The Python surface: communicators, life cycle, array checks, errors."""

import gc
import os
import weakref

import numpy as np
import pytest

import dsopt
from dsopt_testing import adam_config, build_feature

CONFIG = adam_config("AdamW", lr=1e-2)


def test_local_communicator_is_a_world_of_one():
    with dsopt.Communicator.local() as comm:
        assert (comm.rank, comm.size) == (0, 1)
    assert comm.closed
    comm.close()  # idempotent
    with pytest.raises(ValueError):
        comm.rank


def test_close_is_idempotent_and_later_calls_fail(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    opt = dsopt.Optimizer(CONFIG, params)
    opt.close()
    opt.close()
    assert opt.closed
    with pytest.raises(ValueError, match="closed"):
        opt.step([np.ones(8, np.float32)])
    with pytest.raises(ValueError, match="closed"):
        opt.state_dict()


def test_optimizer_keeps_its_arrays_and_communicator_alive(rng):
    comm = dsopt.Communicator.local()
    param = rng.standard_normal(64).astype(np.float32)
    param_ref, comm_ref = weakref.ref(param), weakref.ref(comm)
    opt = dsopt.Optimizer(CONFIG, [param], comm=comm)
    del param, comm
    gc.collect()
    assert param_ref() is not None and comm_ref() is not None
    before = param_ref().copy()
    opt.step([np.ones(64, np.float32)])
    assert not np.array_equal(param_ref(), before)
    assert opt.params[0] is param_ref()
    opt.close()


def test_communicator_close_waits_for_its_optimizers(rng):
    comm = dsopt.Communicator.local()
    params = [rng.standard_normal(8).astype(np.float32)]
    opt = dsopt.Optimizer(CONFIG, params, comm=comm)
    comm.close()
    assert not comm.closed
    opt.step([np.ones(8, np.float32)])
    opt.close()
    assert comm.closed
    with pytest.raises(ValueError, match="closed"):
        dsopt.Optimizer(CONFIG, params, comm=comm)


def test_step_info_fields(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    with dsopt.Optimizer(CONFIG, params) as opt:
        info = opt.step([np.ones(8, np.float32)])
    assert isinstance(info, dsopt.StepInfo)
    assert info.skipped is False and info.compressed is False
    assert info.step == 1 and info.loss_scale == 1.0
    assert info.grad_norm == -1.0 and info.bytes_sent == 0
    assert info.consecutive_skips == 0


def test_step_info_fields_past_struct_size_are_not_written(rng):
    ffi, lib = dsopt.ffi, dsopt.lib
    params = [rng.standard_normal(8).astype(np.float32)]
    grads = [np.ones(8, np.float32)]
    with dsopt.Optimizer(CONFIG, params) as opt:
        tensors = ffi.new("dsopt_tensor[]", 1)
        tensors[0].data = ffi.cast("void *", grads[0].ctypes.data)
        tensors[0].numel = 8
        tensors[0].dtype = lib.DSOPT_FLOAT32
        info = ffi.new("dsopt_step_info *")
        info.skipped = info.compressed = info.reserved = 77
        info.step, info.loss_scale, info.grad_norm, info.bytes_sent = 77, 77.0, 77.0, 77
        info.consecutive_skips = 77
        info.struct_size = ffi.offsetof("dsopt_step_info", "step")  # an older, shorter struct
        dsopt.check(lib.dsopt_step(opt.handle, tensors, 1, info))
        assert (info.skipped, info.compressed) == (0, 0)
        assert (info.step, info.loss_scale, info.grad_norm, info.bytes_sent) == (77, 77.0, 77.0, 77)
        assert info.consecutive_skips == 77
        # The struct before consecutive_skips was added: all but that field.
        info.struct_size = ffi.offsetof("dsopt_step_info", "consecutive_skips")
        dsopt.check(lib.dsopt_step(opt.handle, tensors, 1, info))
        assert info.step == 2 and info.consecutive_skips == 77
        dsopt.check(lib.dsopt_step(opt.handle, tensors, 1, ffi.NULL))  # info may be NULL
        assert opt.step(grads).step == 4


def test_null_handles_are_harmless():
    lib, ffi = dsopt.lib, dsopt.ffi
    assert lib.dsopt_comm_rank(ffi.NULL) == -1 and lib.dsopt_comm_size(ffi.NULL) == -1
    lib.dsopt_destroy(ffi.NULL)
    lib.dsopt_comm_destroy(ffi.NULL)
    out = ffi.new("double *")
    with pytest.raises(dsopt.InvalidArgument):
        dsopt.check(lib.dsopt_get_loss_scale(ffi.NULL, out))


def test_optimizer_type_is_case_insensitive(rng):
    params = [rng.standard_normal(40).astype(np.float32)]
    twin = [params[0].copy()]
    grads = [rng.standard_normal(40).astype(np.float32) for _ in range(4)]
    with dsopt.Optimizer(adam_config("AdamW", lr=1e-2), params) as a, \
            dsopt.Optimizer(adam_config("aDaMw", lr=1e-2), twin) as b:
        for g in grads:
            a.step([g])
            b.step([g])
    assert np.array_equal(params[0], twin[0])


@pytest.mark.parametrize("make", [
    lambda rng: rng.standard_normal((8, 8)).astype(np.float32)[:, ::2],
    lambda rng: rng.standard_normal((8, 8)).astype(np.float32).T,
    lambda rng: rng.standard_normal(16).astype(np.float32)[::2],
], ids=["column_slice", "transposed", "strided"])
def test_non_contiguous_params_are_rejected(rng, make):
    param = make(rng)
    with pytest.raises(ValueError, match="C-contiguous"):
        dsopt.Optimizer(CONFIG, [param])


def test_non_contiguous_grads_are_rejected(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    with dsopt.Optimizer(CONFIG, params) as opt:
        before = params[0].copy()
        with pytest.raises(ValueError, match=r"grads\[0\] must be C-contiguous"):
            opt.step([np.ones(16, np.float32)[::2]])
        assert np.array_equal(params[0], before)


def test_read_only_params_are_rejected(rng):
    param = rng.standard_normal(8).astype(np.float32)
    param.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        dsopt.Optimizer(CONFIG, [param])


def test_read_only_grads_are_fine(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    grad = np.ones(8, np.float32)
    grad.setflags(write=False)
    with dsopt.Optimizer(CONFIG, params) as opt:
        assert opt.step([grad]).step == 1


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint16, np.complex64])
def test_unsupported_param_dtypes_are_type_errors(rng, dtype):
    param = np.ones(8, dtype=dtype)
    with pytest.raises(TypeError, match=str(np.dtype(dtype))) as excinfo:
        dsopt.Optimizer(CONFIG, [param])
    assert isinstance(excinfo.value, dsopt.InvalidArgument)
    if dtype == np.uint16:
        assert "dsopt.bf16" in str(excinfo.value)


def test_non_arrays_are_type_errors():
    with pytest.raises(TypeError, match="list"):
        dsopt.Optimizer(CONFIG, [[1.0, 2.0]])
    with pytest.raises(TypeError, match="bfloat16"):
        dsopt.Optimizer(CONFIG, [(np.ones(4, np.uint16), "float8")])
    with pytest.raises(TypeError, match="uint16"):
        dsopt.bf16(np.ones(4, np.float32))


def test_config_must_be_dict_or_json_text(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    with pytest.raises(TypeError):
        dsopt.Optimizer(42, params)


def test_mixed_group_kinds_are_rejected(rng):
    params = [rng.standard_normal(8).astype(np.float32) for _ in range(2)]
    with pytest.raises(TypeError, match="mix"):
        dsopt.Optimizer(CONFIG, params, groups=[0, {"lr": 1e-3}])
    with pytest.raises(ValueError, match="2 parameters"):
        dsopt.Optimizer(CONFIG, params, groups=[0])


ERRORS = [
    (-1, dsopt.InvalidArgument), (-2, dsopt.Unsupported), (-3, dsopt.OutOfMemory),
    (-4, dsopt.BufferTooSmall), (-5, dsopt.CorruptState), (-6, dsopt.Mismatch),
    (-7, dsopt.CommError), (-8, dsopt.CudaError), (-9, dsopt.InternalError),
    (-10, dsopt.NonFiniteError),
]


@pytest.mark.parametrize("code, error", ERRORS, ids=[e.__name__ for _, e in ERRORS])
def test_check_raises_one_class_per_status(code, error):
    text = dsopt.ffi.string(dsopt.lib.dsopt_status_string(code)).decode()
    with pytest.raises(error) as excinfo:
        dsopt.check(code)
    assert isinstance(excinfo.value, dsopt.DsoptError)
    assert excinfo.value.status == code
    assert text in str(excinfo.value)
    assert sum(issubclass(error, other) for _, other in ERRORS) == 1


def test_check_passes_ok_and_maps_unknown_codes():
    assert dsopt.check(0) == 0
    with pytest.raises(dsopt.DsoptError) as excinfo:
        dsopt.check(-42)
    assert excinfo.value.status == -42


def test_error_message_carries_the_library_detail(rng):
    params = [rng.standard_normal(8).astype(np.float32)]
    config = adam_config("AdamW", freze_step=3)
    with pytest.raises(dsopt.InvalidArgument) as excinfo:
        dsopt.Optimizer(config, params)
    detail = dsopt.ffi.string(dsopt.lib.dsopt_last_error()).decode()
    assert detail and detail in str(excinfo.value)


def test_state_dict_uses_size_query_then_save(rng):
    params = [rng.standard_normal(100).astype(np.float32)]
    with dsopt.Optimizer(CONFIG, params) as opt:
        size = dsopt.ffi.new("uint64_t *")
        dsopt.check(dsopt.lib.dsopt_state_size(opt.handle, size))
        blob = opt.state_dict()
        assert len(blob) == size[0]
        small = dsopt.ffi.new("char[]", len(blob) - 1)
        written = dsopt.ffi.new("uint64_t *")
        with pytest.raises(dsopt.BufferTooSmall):
            dsopt.check(dsopt.lib.dsopt_state_save(opt.handle, small, len(blob) - 1, written))
        assert written[0] == len(blob)


def test_mpi_communicator_needs_initialised_mpi():
    if build_feature("mpi") == "off":
        with pytest.raises(dsopt.Unsupported, match="MPI"):
            dsopt.Communicator.from_fortran_handle(0)
        return
    # This process never initialised MPI.
    with pytest.raises(dsopt.InvalidArgument, match="MPI"):
        dsopt.Communicator.from_fortran_handle(0)


def test_nccl_communicator_needs_nccl_and_a_comm():
    if build_feature("nccl") == "off":
        with pytest.raises(dsopt.Unsupported, match="NCCL"):
            dsopt.Communicator.from_nccl(0x10, None)  # never dereferenced without NCCL
        return
    with pytest.raises(dsopt.InvalidArgument):
        dsopt.Communicator.from_nccl(None, None)


def test_from_mpi4py_needs_a_communicator():
    with pytest.raises(TypeError, match="mpi4py"):
        dsopt.Communicator.from_mpi4py(object())


def test_threads_are_the_configs_or_this_processs_share_of_its_cores(rng):
    p = rng.standard_normal(16).astype(np.float32)
    with dsopt.Optimizer(dict(adam_config("AdamW"), threads=3), [p]) as opt:
        assert opt.threads == 3
    usable = len(os.sched_getaffinity(0))
    # OMP_NUM_THREADS (conftest sets it before libgomp starts) is this
    # process's own choice, capped by the cores it may run on.
    wanted = int(os.environ["OMP_NUM_THREADS"])
    with dsopt.Optimizer(adam_config("AdamW"), [p]) as opt:
        assert opt.threads == max(1, min(wanted, usable))
