"""The Python side of ``dsopt_comm_create_custom``: a ``dsopt_comm_ops``
whose collectives are Python callables (``Communicator.from_callbacks``).

The C function pointers are cffi ``extern "Python"`` functions (declared in
_ffi_build.py, defined below with ``ffi.def_extern``); their ``user`` pointer
is an ``ffi.new_handle`` of a ``CallbackState``. A state stays referenced
(in ``_LIVE``) from creation until dsopt_comm_destroy calls ``release``, so
nothing a callback needs can be freed while dsopt may still call it.

Every callback catches whatever its Python callable raises and returns 1;
``error_message`` then returns the exception's text, which dsopt puts into
the ``DSOPT_ECOMM`` error the dsopt call raises (``dsopt.CommError``). The
exception object itself is kept as ``CallbackState.error``.
"""

import numpy as np

from ._lib import ffi, lib
from ._device_array import CudaBuffer

if not hasattr(lib, "dsopt_comm_create_custom") or not hasattr(lib, "_dsopt_py_allreduce"):
    raise ImportError("dsopt: this build of the cffi extension has no custom communicators "
                      "(dsopt_comm_create_custom and its Python callbacks): rebuild libdsopt, "
                      "then the extension (python3 bindings/python/dsopt/_ffi_build.py)")

ELEM_DTYPES = {
    lib.DSOPT_COMM_FLOAT32: np.dtype(np.float32),
    lib.DSOPT_COMM_FLOAT64: np.dtype(np.float64),
    lib.DSOPT_COMM_INT32: np.dtype(np.int32),
    lib.DSOPT_COMM_INT64: np.dtype(np.int64),
    lib.DSOPT_COMM_UINT8: np.dtype(np.uint8),
}
REDUCTIONS = {lib.DSOPT_COMM_SUM: "sum", lib.DSOPT_COMM_MAX: "max"}
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "alltoall")

# id(state) -> state, from dsopt_comm_create_custom until release().
_LIVE = {}


def numpy_buffer(ptr, count, elem, device, writable, stream):
    """What a callback sees with ``buffers="numpy"``: a numpy array over
    host memory (read-only for a send buffer), a ``CudaBuffer`` for device
    memory."""
    dtype = ELEM_DTYPES[elem]
    if device == lib.DSOPT_COMM_CUDA:
        return CudaBuffer(int(ffi.cast("uintptr_t", ptr)), count, dtype, not writable, stream)
    array = np.frombuffer(ffi.buffer(ffi.cast("char *", ptr), count * dtype.itemsize), dtype)
    if not writable:
        array.flags.writeable = False
    return array


class CallbackState:
    """What the C callbacks reach through ``user``: the Python callables,
    how buffers are wrapped for them, and the text of the last failure."""

    def __init__(self, callbacks, size, wrap, stream):
        self.callbacks = callbacks  # name -> callable
        self.size = size
        self.wrap = wrap            # (ptr, count, elem, device, writable, stream) -> object
        self.stream = stream        # int address of ops.stream (0: legacy default)
        self.error = None           # the exception a callback raised, if any
        self.failed_in = None       # which callback raised it
        self._message = ffi.new("char[]", b"")
        self.handle = ffi.new_handle(self)

    def fail(self, name, exc):
        self.error, self.failed_in = exc, name
        text = f"{name} callback raised {type(exc).__name__}: {exc}"
        self._message = ffi.new("char[]", text.encode("utf-8", "replace"))
        return 1

    def call(self, name, send, recv, send_count, recv_count, elem, device, *extra):
        """Wraps the buffers and calls the Python callable (in place: the
        same object as send and recv)."""
        wrap, stream = self.wrap, self.stream
        out = wrap(recv, recv_count, elem, device, True, stream)
        if send == recv:
            inp = out
        else:
            inp = wrap(send, send_count, elem, device, False, stream)
        self.callbacks[name](inp, out, *extra)
        return 0

    def keep(self):
        _LIVE[id(self)] = self

    def drop(self):
        _LIVE.pop(id(self), None)


def _reduction(op):
    name = REDUCTIONS.get(op)
    if name is None:
        raise ValueError(f"unknown dsopt reduction {op}")
    return name


@ffi.def_extern(error=1)
def _dsopt_py_allreduce(send, recv, count, elem, op, device, user):
    state = ffi.from_handle(user)
    try:
        return state.call("allreduce", send, recv, count, count, elem, device, _reduction(op))
    except BaseException as exc:  # noqa: B902 - nothing may cross the C boundary
        return state.fail("allreduce", exc)


@ffi.def_extern(error=1)
def _dsopt_py_reduce_scatter(send, recv, count, elem, op, device, user):
    state = ffi.from_handle(user)
    try:
        return state.call("reduce_scatter", send, recv, state.size * count, count, elem, device,
                          _reduction(op))
    except BaseException as exc:  # noqa: B902
        return state.fail("reduce_scatter", exc)


@ffi.def_extern(error=1)
def _dsopt_py_allgather(send, recv, count, elem, device, user):
    state = ffi.from_handle(user)
    try:
        return state.call("allgather", send, recv, count, state.size * count, elem, device)
    except BaseException as exc:  # noqa: B902
        return state.fail("allgather", exc)


@ffi.def_extern(error=1)
def _dsopt_py_alltoall(send, recv, count, elem, device, user):
    state = ffi.from_handle(user)
    try:
        return state.call("alltoall", send, recv, state.size * count, state.size * count, elem,
                          device)
    except BaseException as exc:  # noqa: B902
        return state.fail("alltoall", exc)


@ffi.def_extern(error=ffi.NULL)
def _dsopt_py_error_message(code, user):
    return ffi.from_handle(user)._message


@ffi.def_extern()
def _dsopt_py_release(user):
    ffi.from_handle(user).drop()


def create(callbacks, rank, size, wrap, stream_address, concurrent):
    """(``dsopt_comm *``, state) for the callables in ``callbacks`` (a dict
    with the four COLLECTIVES); raises the dsopt error of a rejected
    table."""
    from .errors import check

    state = CallbackState(callbacks, size, wrap, stream_address)
    ops = ffi.new("dsopt_comm_ops *")
    ops.struct_size = ffi.sizeof("dsopt_comm_ops")
    ops.flags = lib.DSOPT_COMM_CONCURRENT if concurrent else 0
    ops.rank, ops.size = rank, size
    ops.stream = ffi.cast("struct CUstream_st *", stream_address)
    ops.allreduce = lib._dsopt_py_allreduce
    ops.reduce_scatter = lib._dsopt_py_reduce_scatter
    ops.allgather = lib._dsopt_py_allgather
    ops.alltoall = lib._dsopt_py_alltoall
    ops.error_message = lib._dsopt_py_error_message
    ops.release = lib._dsopt_py_release
    out = ffi.new("dsopt_comm **")
    state.keep()
    try:
        check(lib.dsopt_comm_create_custom(out, ops, state.handle))
    except BaseException:
        state.drop()  # release is not called when creation fails
        raise
    return out[0], state
