"""Compressed ZeRO's codes for collectives of the caller's own
(``dsopt_codec``, include/dsopt.h "Codecs"; docs/reference/c-api.md
"Codecs"): the bytes are the library's, bit for bit.

    codec = dsopt.Codec("int4", block=64)
    residual = np.zeros(4 * codec.residual_size(n), np.uint8)   # the zero residual
    codes = codec.encode(grads, runs=4, residual=residual)       # 4 runs of n values
    total = codec.decode_sum(received, n=n, runs=4)              # the 4 runs summed in order

Values are fp32 numpy arrays or torch tensors (CPU, or CUDA with
``device="cuda"``); codes and residuals are byte buffers: numpy arrays or
torch tensors, contiguous, their bytes used as they are. Without ``out``
the result is a new array of the kind of the input (numpy, or a torch
tensor on the input's device).
"""

from ._args import as_int32, as_int64
from ._lib import ffi, lib
from .errors import InvalidArgument, InvalidArgumentType, check
from .tensors import _is_torch_tensor, describe

NAMES = ("int8", "int4", "sign", "bf16")


def _byte_span(obj, what: str, writable: bool):
    """(address, bytes) of a contiguous numpy array or torch tensor."""
    if _is_torch_tensor(obj):
        if not obj.is_contiguous():
            raise InvalidArgument(f"{what} must be contiguous")
        return int(obj.data_ptr()), int(obj.numel()) * int(obj.element_size())
    interface = getattr(obj, "__array_interface__", None)
    if interface is None:
        raise InvalidArgumentType(f"{what}: expected a numpy array or a torch tensor, got {type(obj).__name__}")
    if not obj.flags.c_contiguous:
        raise InvalidArgument(f"{what} must be C-contiguous")
    if writable and not obj.flags.writeable:
        raise InvalidArgument(f"{what} is read-only, but the codec writes it")
    return interface["data"][0], int(obj.nbytes)


def _new_like(obj, count: int, kind: str):
    """A new array of `count` elements ("uint8" or "float32") of obj's kind."""
    if _is_torch_tensor(obj):
        import torch
        return torch.empty(count, dtype=getattr(torch, kind), device=obj.device)
    import numpy as np
    return np.empty(count, dtype=kind)


def _fp32(obj, what: str, writable: bool):
    buf = describe(obj, writable=writable, what=what)
    return ffi.new("dsopt_tensor *", {"data": ffi.cast("void *", buf.address), "numel": buf.numel,
                                      "dtype": buf.dtype, "group": 0})


class Codec:
    """One codec: ``name`` one of ``"int8"``, ``"int4"``, ``"sign"``
    (``block`` elements per scaled block: a multiple of 8 in [8, 65536];
    0 is 64, compressed ZeRO's gradient blocks) or ``"bf16"`` (no blocks,
    no residual). ``device`` "cpu" or "cuda" (where every buffer lives;
    CUDA work is queued on ``stream``, a ``torch.cuda.Stream`` or a raw
    ``cudaStream_t`` address, None for the legacy default stream, and
    changed with ``set_stream``). ``threads``: CPU threads (0: OpenMP's
    count). Nothing here is collective."""

    def __init__(self, name, *, block=0, device="cpu", threads=0, stream=None):
        if name not in NAMES:
            raise InvalidArgument(f"unknown codec name {name!r}: one of {', '.join(map(repr, NAMES))}")
        kind = str(device).split(":")[0]
        if kind not in ("cpu", "cuda"):
            raise InvalidArgument(f"device must be 'cpu' or 'cuda', got {device!r}")
        options = ffi.new("dsopt_codec_options *")
        options.struct_size = ffi.sizeof("dsopt_codec_options")
        options.device = lib.DSOPT_COMM_CUDA if kind == "cuda" else lib.DSOPT_COMM_HOST
        options.block = as_int64(block, "block")
        options.threads = as_int32(threads, "threads")
        options.stream = self._stream_pointer(stream)
        out = ffi.new("dsopt_codec **")
        check(lib.dsopt_codec_create(out, name.encode(), options))
        self._handle = ffi.gc(out[0], lib.dsopt_codec_destroy)
        self.name, self.device, self.block = name, kind, block

    @staticmethod
    def _stream_pointer(stream):
        if stream is None:
            return ffi.NULL
        return ffi.cast("struct CUstream_st *", int(getattr(stream, "cuda_stream", stream)))

    def _live(self):
        if self._handle is None:
            raise InvalidArgument("the codec is closed")
        return self._handle

    def encoded_size(self, n) -> int:
        """Bytes of the code of one run of ``n`` values."""
        out = ffi.new("uint64_t *")
        check(lib.dsopt_codec_encoded_size(self._live(), as_int64(n, "n"), out))
        return int(out[0])

    def residual_size(self, n) -> int:
        """Bytes of the error-feedback residual of one run of ``n`` values
        (all zero: the zero residual). ``Unsupported`` for bf16."""
        out = ffi.new("uint64_t *")
        check(lib.dsopt_codec_residual_size(self._live(), as_int64(n, "n"), out))
        return int(out[0])

    def encode(self, values, runs=1, *, residual=None, out=None):
        """The codes of ``runs`` runs of ``len(values) / runs`` fp32 values
        each, back to back (into ``out`` when given; returned). With
        ``residual`` (``runs`` residual runs): error feedback, the residual
        updated in place."""
        handle = self._live()
        runs = as_int64(runs, "runs")
        tensor = _fp32(values, "values", writable=False)
        if out is None:
            n = tensor.numel // runs if runs > 0 and tensor.numel > 0 else 1
            out = _new_like(values, max(runs, 0) * self.encoded_size(max(n, 1)), "uint8")
        dst, capacity = _byte_span(out, "out", writable=True)
        e_ptr, e_size = ffi.NULL, 0
        if residual is not None:
            e_addr, e_size = _byte_span(residual, "residual", writable=True)
            e_ptr = ffi.cast("void *", e_addr)
        check(lib.dsopt_codec_encode(handle, tensor, runs, e_ptr, e_size, ffi.cast("void *", dst), capacity))
        return out

    def decode_sum(self, codes, out=None, *, n=None, runs=1):
        """The sum over ``runs`` codes of ``n`` values each (``codes`` back
        to back), in run order, as fp32 values (into ``out`` when given,
        whose length is ``n``; returned). ``runs=1`` decodes one run."""
        handle = self._live()
        if out is None:
            if n is None:
                raise InvalidArgument("decode_sum needs out or n")
            out = _new_like(codes, as_int64(n, "n"), "float32")
        src, size = _byte_span(codes, "codes", writable=False)
        check(lib.dsopt_codec_decode_sum(handle, ffi.cast("void *", src), size, as_int64(runs, "runs"),
                                         _fp32(out, "out", writable=True)))
        return out

    def set_stream(self, stream):
        """CUDA: later work is queued on ``stream`` (after the work so far)."""
        check(lib.dsopt_codec_set_stream(self._live(), self._stream_pointer(stream)))

    def close(self):
        """Frees the codec now (also done when it is garbage)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            ffi.release(handle)  # runs dsopt_codec_destroy now

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        block = f", block={self.block}" if self.block else ""  # 0: the default
        return f"dsopt.Codec({self.name!r}{block}, device={self.device!r})"


__all__ = ["Codec", "NAMES"]
