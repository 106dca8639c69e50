"""dsopt.Communicator: the world an optimizer averages gradients over.

The MPI or NCCL communicator behind it is borrowed, never freed; the Python
object it came from (an mpi4py communicator, say) is kept referenced for as
long as the wrapper lives. ``close()`` releases the wrapper; while optimizers
created on it are still open, the release waits until the last one closes.
"""

import warnings

from ._lib import ffi, lib
from .errors import InvalidArgumentType, check


def _address(obj, what: str) -> int:
    """An int address from an int, a cffi pointer, or an object with a
    ``cuda_stream`` attribute (torch / CuPy streams); None is 0."""
    if obj is None:
        return 0
    if isinstance(obj, ffi.CData):
        return int(ffi.cast("uintptr_t", obj))
    if hasattr(obj, "cuda_stream"):
        return int(obj.cuda_stream)
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    raise InvalidArgumentType(f"{what}: expected an int address or a cffi pointer, got {type(obj).__name__}")


class Communicator:
    """Use the class methods to create one: ``local()``, ``from_mpi4py(comm)``,
    ``from_fortran_handle(h)``, ``from_nccl(comm_ptr, stream_ptr)``."""

    def __init__(self, _handle, _kind: str, _borrowed=None):
        self._handle = _handle
        self.kind = _kind
        self._borrowed = _borrowed
        self._users = set()
        self._close_requested = False

    @classmethod
    def _create(cls, kind: str, create, borrowed=None) -> "Communicator":
        out = ffi.new("dsopt_comm **")
        check(create(out))
        return cls(out[0], kind, borrowed)

    @classmethod
    def local(cls) -> "Communicator":
        """A world of one rank (no communication)."""
        return cls._create("local", lib.dsopt_comm_create_local)

    @classmethod
    def from_fortran_handle(cls, handle: int, *, _borrowed=None) -> "Communicator":
        """An MPI communicator given by its Fortran handle (``MPI_Comm_c2f``).
        MPI must be initialised and the communicator must outlive this object."""
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise InvalidArgumentType(f"an MPI Fortran handle is an int, got {type(handle).__name__}")
        return cls._create("mpi", lambda out: lib.dsopt_comm_create_mpi(out, handle), _borrowed)

    @classmethod
    def from_mpi4py(cls, comm) -> "Communicator":
        """An mpi4py communicator (through ``comm.py2f()``); it is kept referenced."""
        if not hasattr(comm, "py2f"):
            raise InvalidArgumentType(f"expected an mpi4py communicator, got {type(comm).__name__}")
        return cls.from_fortran_handle(int(comm.py2f()), _borrowed=comm)

    @classmethod
    def from_nccl(cls, comm_ptr, stream_ptr=None) -> "Communicator":
        """An NCCL communicator (``ncclComm_t`` address) and the CUDA stream
        dsopt's device work runs on (address, or None for the legacy default
        stream). Both must outlive this object."""
        comm = ffi.cast("struct ncclComm *", _address(comm_ptr, "comm_ptr"))
        stream = ffi.cast("struct CUstream_st *", _address(stream_ptr, "stream_ptr"))
        return cls._create(
            "nccl", lambda out: lib.dsopt_comm_create_nccl(out, comm, stream), (comm_ptr, stream_ptr)
        )

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def handle(self):
        """The ``dsopt_comm *`` (cffi pointer); ValueError once closed."""
        if self._handle is None:
            raise ValueError("dsopt.Communicator is closed")
        return self._handle

    @property
    def rank(self) -> int:
        return lib.dsopt_comm_rank(self.handle)

    @property
    def size(self) -> int:
        return lib.dsopt_comm_size(self.handle)

    def _acquire(self, user) -> None:
        if self._close_requested:
            raise ValueError("dsopt.Communicator is closed")
        self.handle  # raises when closed
        self._users.add(id(user))

    def _release(self, user) -> None:
        self._users.discard(id(user))
        if self._close_requested and not self._users:
            self._destroy()

    def _destroy(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.dsopt_comm_destroy(handle)

    def close(self) -> None:
        """Releases the wrapper (idempotent); deferred while optimizers use it."""
        self._close_requested = True
        if not self._users:
            self._destroy()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is None:
            return
        if self.kind == "local":
            self._destroy()
        else:
            # MPI may already be finalised at this point: leak rather than call into it.
            warnings.warn(f"unclosed dsopt.Communicator ({self.kind}); call close()", ResourceWarning)

    def __repr__(self) -> str:
        if self.closed:
            return f"<dsopt.Communicator {self.kind} closed>"
        return f"<dsopt.Communicator {self.kind} rank={self.rank} size={self.size}>"


__all__ = ["Communicator"]
