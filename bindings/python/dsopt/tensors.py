"""Array objects -> dsopt_tensor descriptors.

numpy arrays and torch tensors (CPU or CUDA, through ``data_ptr()``; torch
is never imported here) are understood. Each supported array kind is one
``_describe_*`` function returning a ``_Buffer``, tried in ``describe``.

bfloat16 has no numpy dtype: a bf16 array is a numpy ``uint16`` array holding
the raw bits, tagged either as ``dsopt.bf16(a)`` or as the tuple
``(a, "bfloat16")``. Arrays of the ``ml_dtypes.bfloat16`` dtype are accepted
as they are.
"""

from dataclasses import dataclass

import numpy as np

from ._lib import ffi, lib
from ._args import as_int32
from .errors import InvalidArgument, InvalidArgumentType

_BF16_TAGS = ("bfloat16", "bf16")


class bf16:
    """Tags a numpy uint16 array (raw bfloat16 bits) as a bf16 tensor."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = _bf16_bits(array, "dsopt.bf16")

    def __repr__(self):
        return f"dsopt.bf16(shape={self.array.shape})"


@dataclass(frozen=True)
class _Buffer:
    """What one dsopt_tensor needs, plus the object that owns the memory."""

    address: int
    numel: int
    dtype: int
    owner: object


def _type_name(obj) -> str:
    if isinstance(obj, np.ndarray):
        return f"numpy array of dtype {obj.dtype}"
    return type(obj).__name__


def _bf16_bits(array, what: str) -> np.ndarray:
    if not isinstance(array, np.ndarray) or array.dtype != np.uint16:
        raise InvalidArgumentType(
            f"{what}: bfloat16 data must be a numpy uint16 array of raw bits, got {_type_name(array)}"
        )
    return array


def _numpy_dtype_code(array: np.ndarray, what: str) -> int:
    if array.dtype == np.float32:
        return lib.DSOPT_FLOAT32
    if array.dtype == np.float16:
        return lib.DSOPT_FLOAT16
    if array.dtype.name == "bfloat16" and array.dtype.itemsize == 2:
        return lib.DSOPT_BFLOAT16
    hint = ""
    if array.dtype == np.uint16:
        hint = "; a uint16 array holding bfloat16 bits must be tagged: dsopt.bf16(a) or (a, 'bfloat16')"
    raise InvalidArgumentType(
        f"{what}: unsupported dtype {array.dtype} (float32, float16 or bfloat16){hint}"
    )


def _describe_ndarray(array: np.ndarray, dtype_code: int, writable: bool, what: str) -> _Buffer:
    if not array.flags.c_contiguous:
        raise InvalidArgument(
            f"{what} must be C-contiguous (shape {array.shape}, strides {array.strides}); "
            "pass numpy.ascontiguousarray(a), and for parameters keep that copy"
        )
    if not array.flags.aligned:
        raise InvalidArgument(f"{what} is not aligned to its element size")
    if writable and not array.flags.writeable:
        raise InvalidArgument(f"{what} is read-only, but dsopt updates parameters in place")
    return _Buffer(array.__array_interface__["data"][0], int(array.size), dtype_code, array)


_TORCH_DTYPES = {
    "torch.float32": lib.DSOPT_FLOAT32,
    "torch.float16": lib.DSOPT_FLOAT16,
    "torch.bfloat16": lib.DSOPT_BFLOAT16,
}


def _is_torch_tensor(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr")


def _describe_torch(tensor, writable: bool, what: str) -> _Buffer:
    dtype_code = _TORCH_DTYPES.get(str(tensor.dtype))
    if dtype_code is None:
        raise InvalidArgumentType(
            f"{what}: unsupported dtype {tensor.dtype} (float32, float16 or bfloat16)")
    if str(tensor.layout) != "torch.strided":
        raise InvalidArgument(f"{what}: only dense (strided) tensors are supported")
    if not tensor.is_contiguous():
        raise InvalidArgument(f"{what} must be contiguous; pass tensor.contiguous() "
                              "(and for parameters keep that copy)")
    return _Buffer(int(tensor.data_ptr()), int(tensor.numel()), dtype_code, tensor)


def describe(obj, *, writable: bool, what: str) -> _Buffer:
    """The buffer behind ``obj`` (see the module doc for what is accepted)."""
    if isinstance(obj, bf16):
        return _describe_ndarray(obj.array, lib.DSOPT_BFLOAT16, writable, what)
    if isinstance(obj, tuple):
        if len(obj) != 2 or not isinstance(obj[1], str) or obj[1].lower() not in _BF16_TAGS:
            raise InvalidArgumentType(f"{what}: a tuple must be (uint16 array, 'bfloat16')")
        return _describe_ndarray(_bf16_bits(obj[0], what), lib.DSOPT_BFLOAT16, writable, what)
    if isinstance(obj, np.ndarray):
        return _describe_ndarray(obj, _numpy_dtype_code(obj, what), writable, what)
    if _is_torch_tensor(obj):
        return _describe_torch(obj, writable, what)
    raise InvalidArgumentType(
        f"{what}: expected a numpy array, a torch tensor, dsopt.bf16(...) or (array, 'bfloat16'), "
        f"got {_type_name(obj)}"
    )


class TensorList:
    """A ``dsopt_tensor[]`` for a sequence of arrays; keeps the arrays alive."""

    def __init__(self, objects, *, writable: bool, kind: str, groups=None):
        objects = list(objects)
        self.buffers = [
            describe(obj, writable=writable, what=f"{kind}[{i}]") for i, obj in enumerate(objects)
        ]
        self.objects = objects
        self.c_array = ffi.new("dsopt_tensor[]", max(len(objects), 1))
        for i, buf in enumerate(self.buffers):
            entry = self.c_array[i]
            entry.data = ffi.cast("void *", buf.address)
            entry.numel = buf.numel
            entry.dtype = buf.dtype
            entry.group = 0 if groups is None else as_int32(groups[i], f"group of {kind}[{i}]")

    def __len__(self):
        return len(self.buffers)


__all__ = ["bf16", "describe", "TensorList"]
