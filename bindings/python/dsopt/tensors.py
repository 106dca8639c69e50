"""Array objects -> dsopt_tensor descriptors.

numpy arrays and torch tensors (CPU or CUDA, through ``data_ptr()``; torch
is never imported here) are understood. Each supported array kind is one
``_describe_*`` function returning a ``_Buffer``, tried in ``describe``.

bfloat16 has no numpy dtype: a bf16 array is a numpy ``uint16`` array holding
the raw bits, tagged either as ``dsopt.bf16(a)`` or as the tuple
``(a, "bfloat16")``. Arrays of the ``ml_dtypes.bfloat16`` dtype are accepted
as they are.

``GradDescriptors`` keeps the ``dsopt_tensor[]`` of the gradients from one
step to the next and describes again only the entries whose objects
changed; it writes the entries through ``tensor_records`` (a numpy
structured view of the C array).
"""

import operator
from dataclasses import dataclass
from itertools import compress

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


def _tensor_record_dtype() -> np.dtype:
    """The numpy dtype of one ``dsopt_tensor`` (include/dsopt.h) at cffi's
    offsets, each field's size checked against cffi's."""
    expected = {"data": np.uintp, "numel": np.int64, "dtype": np.int32, "group": np.int32}
    fields = ffi.typeof("dsopt_tensor").fields
    names = [name for name, _ in fields]
    if names != list(expected):
        raise ImportError(f"dsopt: dsopt_tensor has the fields {names}, the binding expects "
                          f"{list(expected)} (dsopt/tensors.py)")
    for name, field in fields:
        if ffi.sizeof(field.type) != np.dtype(expected[name]).itemsize:
            raise ImportError(f"dsopt: dsopt_tensor.{name} ({field.type.cname}) has "
                              f"{ffi.sizeof(field.type)} bytes, the binding writes it as "
                              f"{np.dtype(expected[name])} (dsopt/tensors.py)")
    return np.dtype({"names": names,
                     "formats": [expected[name] for name in names],
                     "offsets": [ffi.offsetof("dsopt_tensor", name) for name in names],
                     "itemsize": ffi.sizeof("dsopt_tensor")})


TENSOR_RECORD = _tensor_record_dtype()


def tensor_records(c_array) -> np.ndarray:
    """A writable numpy view (dtype ``TENSOR_RECORD``) of a ``dsopt_tensor[]``;
    it keeps the C array alive."""
    return np.frombuffer(ffi.buffer(c_array), dtype=TENSOR_RECORD)


_is, _is_not = operator.is_, operator.is_not
_get_dtype = operator.attrgetter("dtype")
_get_flags = operator.attrgetter("flags")
_get_c_contiguous = operator.attrgetter("c_contiguous")
_get_aligned = operator.attrgetter("aligned")
_get_size = operator.attrgetter("size")

# The dtypes of _describe_plain_arrays (numpy's buffer export handles
# them; ml_dtypes' bfloat16 and tagged bf16 go through describe).
_FAST_NUMPY_CODES = {
    np.dtype(np.float32): lib.DSOPT_FLOAT32,
    np.dtype(np.float16): lib.DSOPT_FLOAT16,
}


def _pointers_of(buffers) -> np.ndarray:
    """The data pointers (uintp) of C-contiguous buffer objects, in order."""
    pointers = ffi.new("void *[]", list(map(ffi.from_buffer, buffers)))
    return np.frombuffer(ffi.buffer(pointers), dtype=np.uintp)


def _describe_plain_arrays(objects):
    """(pointers, numels, dtype codes) of ``objects`` when every one is a
    plain numpy float32 / float16 array, C-contiguous and aligned, so that
    ``describe`` would accept each as a read-only array; else None (nothing
    raised: the caller then uses ``describe``, which raises as it does)."""
    if set(map(type, objects)) != {np.ndarray}:
        return None
    codes = list(map(_FAST_NUMPY_CODES.get, map(_get_dtype, objects)))
    if None in codes:
        return None
    flags = list(map(_get_flags, objects))
    if not (all(map(_get_c_contiguous, flags)) and all(map(_get_aligned, flags))):
        return None
    numels = np.fromiter(map(_get_size, objects), np.int64, len(objects))
    return _pointers_of(objects), numels, np.array(codes, dtype=np.int32)


# What an absent gradient (None) is described as: data NULL (dsopt reads
# neither numel nor dtype then).
_ABSENT = _Buffer(0, 0, 0, None)


class GradDescriptors:
    """The ``dsopt_tensor[]`` of the read-only arrays of successive calls
    (the gradients of ``Optimizer.step``), ``num`` entries; ``None``
    entries are absent gradients (data NULL).

    ``update(objects)`` describes an entry again only when its object is
    not the one of the previous successful update (``is``); the objects
    (and what their buffers belong to) stay referenced until they are
    replaced or ``clear()`` runs, so the memory behind the descriptors
    stays allocated. An entry that does not validate raises as
    ``describe`` does, and then nothing changes."""

    def __init__(self, num: int, kind: str = "grads"):
        self.kind = kind
        self.num = num
        self.c_array = ffi.new("dsopt_tensor[]", max(num, 1))
        self.records = tensor_records(self.c_array)
        self.clear()

    def clear(self) -> None:
        """Forgets every description and drops the references."""
        self.objects = None  # the described objects, a list of num; None: nothing described
        self.owners = {}  # index -> its buffer's owner, where that is not the object itself
        self.records[:] = 0

    def update(self, objects: list) -> None:
        """Describes ``objects`` (a list of ``num``, which this keeps)."""
        old = self.objects
        if old is not None and all(map(_is, objects, old)):
            return
        n = self.num
        if old is None or not any(map(_is, objects, old)):
            changed = None  # every entry
            subset = objects
        else:
            changed = list(compress(range(n), map(_is_not, objects, old)))
            subset = list(map(objects.__getitem__, changed))
        indices = range(n) if changed is None else changed
        described = _describe_plain_arrays(subset) if subset else None
        buffers = None
        if described is None:
            # None: an absent gradient, a descriptor with data NULL.
            buffers = [_ABSENT if obj is None else
                       describe(obj, writable=False, what=f"{self.kind}[{i}]")
                       for i, obj in zip(indices, subset)]
            count = len(buffers)
            described = (
                np.fromiter(map(operator.attrgetter("address"), buffers), np.uintp, count),
                np.fromiter(map(operator.attrgetter("numel"), buffers), np.int64, count),
                np.fromiter(map(operator.attrgetter("dtype"), buffers), np.int32, count),
            )
        # Every changed entry validated: write them.
        pointers, numels, codes = described
        records = self.records
        where = slice(0, n) if changed is None else changed
        records["data"][where] = pointers
        records["numel"][where] = numels
        records["dtype"][where] = codes
        owners = self.owners
        if owners:
            if changed is None:
                owners.clear()
            else:
                for i in changed:
                    owners.pop(i, None)
        if buffers is not None:
            for i, obj, buf in zip(indices, subset, buffers):
                if buf.owner is not obj and obj is not None:
                    owners[i] = buf.owner
        self.objects = objects


class TensorList:
    """A ``dsopt_tensor[]`` for a sequence of arrays; keeps the arrays alive."""

    def __init__(self, objects, *, writable: bool, kind: str, groups=None, allow_none=False):
        objects = list(objects)
        self.buffers = [
            _ABSENT if obj is None and allow_none else
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


__all__ = ["bf16", "describe", "GradDescriptors", "TENSOR_RECORD", "TensorList",
           "tensor_records"]
