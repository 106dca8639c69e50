"""A view of device memory for code outside dsopt: the leaf module that the
communicators and the optimizer share (it imports nothing of dsopt)."""


class CudaBuffer:
    """A device buffer dsopt hands a ``from_callbacks`` callable
    (``buffers="numpy"``): a 1-D array of ``shape[0]`` elements of
    ``dtype`` at address ``ptr``, exposed as ``__cuda_array_interface__``
    (version 3; ``stream`` is the stream dsopt queued its work on), so
    ``cupy.asarray`` or Numba take it without a copy (torch:
    ``torch.as_tensor(buf, device="cuda")``). Valid only during the
    callback."""

    __slots__ = ("ptr", "shape", "dtype", "readonly", "stream")

    def __init__(self, ptr, count, dtype, readonly, stream):
        self.ptr, self.shape, self.dtype = ptr, (count,), dtype
        self.readonly, self.stream = readonly, stream

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, self.readonly),
                "strides": None, "version": 3, "stream": self.stream or 1}  # 1: legacy default

    def __repr__(self):
        return f"<dsopt.CudaBuffer {self.dtype} [{self.shape[0]}] at {self.ptr:#x}>"
