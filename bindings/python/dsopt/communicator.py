"""dsopt.Communicator: the world an optimizer averages gradients over.

The MPI or NCCL communicator behind it is borrowed, never freed; the Python
object it came from (an mpi4py communicator, say) is kept referenced for as
long as the wrapper lives. ``close()`` releases the wrapper; while optimizers
created on it are still open, the release waits until the last one closes.

``from_callbacks`` and ``from_torch`` build a communicator whose collectives
are Python code (``dsopt_comm_create_custom``): callables of the caller, or
torch.distributed on a process group. A Python exception raised by such a
collective fails the dsopt call that ran it with ``dsopt.CommError``
carrying the exception's text (the exception itself is
``Communicator.callback_error``); dsopt does not use the communicator again.
"""

import warnings

from ._lib import ffi, lib
from ._device_array import CudaBuffer
from .errors import InvalidArgument, InvalidArgumentType, check


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
    ``from_fortran_handle(h)``, ``from_nccl(comm_ptr, stream_ptr)``,
    ``from_callbacks(rank, size, ...)``, ``from_torch(group)``."""

    group = None  # the torch ProcessGroup of from_torch

    def __init__(self, _handle, _kind: str, _borrowed=None):
        self._handle = _handle
        self.kind = _kind
        self._borrowed = _borrowed
        self._callbacks = None  # the CallbackState of from_callbacks / from_torch
        self._callback_error = None
        self._users = set()
        self._close_requested = False
        self._nodes = None  # (node, rail, whether this one closes them) of set_nodes
        self._shards = None  # (shards, whether this one closes it) of set_shards

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

    @classmethod
    def from_callbacks(cls, rank: int, size: int, *, allreduce, reduce_scatter, allgather,
                       alltoall, buffers="numpy", stream=None, concurrent=False,
                       _kind="callbacks", _borrowed=None, _wrap=None) -> "Communicator":
        """A communicator whose collectives are Python callables (collective
        over the caller's own runtime; ``rank``/``size`` are this process's
        place in it). Each is called by every rank, in the same order, with
        1-D buffers of the same dtype:

        * ``allreduce(send, recv, op)``: ``recv[i]`` = op over ranks of
          ``send[i]``; ``op`` is ``"sum"`` or ``"max"``; in place when
          ``send is recv``.
        * ``reduce_scatter(send, recv, op)``: ``send`` holds ``size`` blocks
          of ``len(recv)``; rank r gets the op over ranks of block r.
        * ``allgather(send, recv)``: block r of ``recv`` is rank r's ``send``.
        * ``alltoall(send, recv)``: block j of ``send`` goes to rank j;
          block i of ``recv`` came from rank i.

        ``buffers="numpy"``: host buffers are numpy arrays (``send``
        read-only) and device buffers ``dsopt.CudaBuffer`` objects
        (``__cuda_array_interface__``); ``buffers="torch"``: torch tensors on
        the memory (CPU, or CUDA). No copy is made: buffers are valid only
        during the call, which must finish the collective (device buffers:
        or order it on ``stream``, after the work dsopt queued there).
        Float dtypes come in only on device buffers: on the host dsopt sums
        floats itself, in a fixed order, from alltoall and allgather.

        A callback returns nothing; whatever it raises fails the dsopt call
        with ``dsopt.CommError`` carrying the exception's text (kept as
        ``callback_error``). It must raise rather than wait forever for a
        rank that failed (use the runtime's timeouts). ``stream``: the CUDA
        stream dsopt's device work runs on (address, cffi pointer or torch
        stream; None: the legacy default stream). ``concurrent=True`` lets
        dsopt call the callbacks from a thread of its own while this thread
        runs (``DSOPT_COMM_CONCURRENT``, for ``grad_ready`` overlap): they
        then run with the GIL, next to this thread's Python code.

        The callables are kept referenced until the communicator is
        released (``close()``, after its last optimizer)."""
        from . import _callback_comm

        callbacks = {"allreduce": allreduce, "reduce_scatter": reduce_scatter,
                     "allgather": allgather, "alltoall": alltoall}
        for name, fn in callbacks.items():
            if not callable(fn):
                raise InvalidArgumentType(f"{name} must be callable, got {type(fn).__name__}")
        for name, value in (("rank", rank), ("size", size)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidArgumentType(f"{name} must be an int, got {type(value).__name__}")
        if _wrap is not None:
            wrap = _wrap
        elif buffers == "numpy":
            wrap = _callback_comm.numpy_buffer
        elif buffers == "torch":
            from ._torch_comm import torch_buffer as wrap
        else:
            raise InvalidArgument(f'buffers must be "numpy" or "torch", got {buffers!r}')
        handle, state = _callback_comm.create(callbacks, rank, size, wrap,
                                              _address(stream, "stream"), concurrent)
        comm = cls(handle, _kind, (_borrowed, stream))
        comm._callbacks = state
        return comm

    @classmethod
    def from_torch(cls, group=None, *, stream=None, concurrent=False) -> "Communicator":
        """torch.distributed's collectives on ``group`` (a ProcessGroup;
        None: the default group), with this process's rank and size in it.
        torch.distributed must be initialised and this process a member of
        the group (else RuntimeError / ValueError).

        Buffers become tensors without copies; a backend that cannot take
        them (gloo: CUDA memory; NCCL: host memory) gets copies, and an
        operation the backend or torch version lacks (gloo's reduce-scatter,
        say) is made of others. ``stream``: the CUDA stream of dsopt's device
        work, default torch's current stream when the backend is NCCL or
        CUDA is already initialised (the legacy default stream otherwise);
        device collectives run on it. dsopt's device buffers become tensors
        of the communicator's CUDA device: the stream's, else that of the
        first dsopt.torch optimizer's parameters (``torch_collectives.device``;
        an optimizer whose parameters are on another device is refused
        with ValueError). Send buffers are handed to torch writable (torch
        takes no read-only CUDA arrays); no collective writes to them. Timeouts are the group's (the
        ``timeout`` of ``init_process_group`` / ``new_group``): a rank whose
        peer failed raises ``dsopt.CommError`` when it expires."""
        from ._torch_comm import TorchCollectives

        collectives = TorchCollectives(group, stream)
        comm = cls.from_callbacks(collectives.rank, collectives.size, **collectives.callbacks(),
                                  buffers="torch", stream=collectives.stream,
                                  concurrent=concurrent, _kind="torch", _borrowed=collectives,
                                  _wrap=collectives.buffer)
        comm.group = collectives.group
        return comm

    @property
    def torch_collectives(self):
        """The ``TorchCollectives`` of a ``from_torch`` communicator (its
        process group, backend, device and fallbacks); None for other
        kinds."""
        if self.kind != "torch" or not self._borrowed:
            return None
        return self._borrowed[0]

    @property
    def mpi4py_comm(self):
        """The mpi4py communicator of ``from_mpi4py`` (kept referenced by
        this object); None for other kinds."""
        if self.kind != "mpi" or not hasattr(self._borrowed, "py2f"):
            return None
        return self._borrowed

    @property
    def callback_error(self):
        """The exception a Python collective of ``from_callbacks`` /
        ``from_torch`` raised (None when none did, or for other kinds)."""
        if self._callbacks is None:
            return self._callback_error
        return self._callbacks.error

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

    @property
    def nodes(self):
        """The (node, rail) communicators of ``set_nodes``; None without."""
        return self._nodes[:2] if self._nodes else None

    def set_nodes(self, node, rail, *, close_with=False) -> None:
        """Gives dsopt the node and rail communicators of this one
        (``dsopt_comm_set_nodes``): ``node`` holds the ranks of this rank's
        node ranked by local index (R ranks), ``rail`` the ranks of its
        local index, one per node, ranked by node (N ranks), N * R this
        communicator's size. Optimizers created afterwards take their
        topology from them and, where the config's ``"topology"``
        ``"hierarchy"`` makes them node-aware, run the compressed
        collectives of the 1-bit optimizers on them (how callback and
        torch communicators, which dsopt cannot split, run node-aware).
        Both are kept open while this one is (``close()`` on them waits for
        it); ``close_with=True`` closes them with it. ``set_nodes(None,
        None)`` forgets them. The layout is checked by the optimizers'
        creation (``InvalidArgument`` on every rank where they do not fit).
        """
        if (node is None) != (rail is None):
            raise InvalidArgument("set_nodes: give both node and rail, or neither")
        for name, c in (("node", node), ("rail", rail)):
            if c is not None and not isinstance(c, Communicator):
                raise InvalidArgumentType(f"{name} must be a dsopt.Communicator, got {type(c).__name__}")
        if node is None:
            check(lib.dsopt_comm_set_nodes(self.handle, ffi.NULL, ffi.NULL))
        else:
            check(lib.dsopt_comm_set_nodes(self.handle, node.handle, rail.handle))
            node._acquire(self)
            rail._acquire(self)
        self._let_go_of_nodes()
        if node is not None:
            self._nodes = (node, rail, bool(close_with))

    @property
    def shards(self):
        """The communicator of ``set_shards``; None without."""
        return self._shards[0] if self._shards else None

    def set_shards(self, shards, *, close_with=False) -> None:
        """Declares that the parameters of optimizers created on this
        communicator afterwards are this rank's shards of tensors that the
        ranks of ``shards`` (a ``dsopt.Communicator``) hold together, as
        FSDP shards a model (``dsopt_comm_set_shards``): such an optimizer
        averages gradients over this communicator only and reduces over
        ``shards`` what whole tensors decide (the non-finite check, the
        global gradient norm, LAMB's per-tensor norms); a parameter may have
        no element on this rank. ``shards`` is kept open while this one is;
        ``close_with=True`` closes it with this one. ``set_shards(None)``
        forgets it."""
        if shards is not None and not isinstance(shards, Communicator):
            raise InvalidArgumentType(f"shards must be a dsopt.Communicator, got {type(shards).__name__}")
        check(lib.dsopt_comm_set_shards(self.handle, ffi.NULL if shards is None else shards.handle))
        if shards is not None:
            shards._acquire(self)
        self._let_go_of_shards()
        if shards is not None:
            self._shards = (shards, bool(close_with))

    def _let_go_of_shards(self) -> None:
        shards, self._shards = self._shards, None
        if shards:
            shards[0]._release(self)
            if shards[1]:
                shards[0].close()

    def _let_go_of_nodes(self) -> None:
        nodes, self._nodes = self._nodes, None
        if nodes:
            for c in nodes[:2]:
                c._release(self)
                if nodes[2]:
                    c.close()

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
        self._let_go_of_nodes()
        self._let_go_of_shards()
        if self._callbacks is not None:
            # dsopt released them: drop the callables, keep what they raised
            self._callback_error, self._callbacks = self._callbacks.error, None
            if self.kind == "torch" and self._borrowed:
                self._borrowed[0].release()
            self._borrowed = None
        # A closed communicator, and any garbage cycle that holds one (an
        # optimizer's), keeps no torch process group alive: the group goes
        # with torch.distributed.destroy_process_group(), not at interpreter
        # exit, where tearing gloo down can abort the process.
        self.group = None

    def close(self) -> None:
        """Releases the wrapper (idempotent); deferred while optimizers use it.
        A ``from_torch`` communicator lets go of its process group then."""
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
            # Deferred while optimizers use it: in a reference cycle their
            # finalizers may run after this one.
            self.close()
        else:
            # MPI may already be finalised at this point: leak rather than call into it.
            warnings.warn(f"unclosed dsopt.Communicator ({self.kind}); call close()", ResourceWarning)

    def __repr__(self) -> str:
        if self.closed:
            return f"<dsopt.Communicator {self.kind} closed>"
        return f"<dsopt.Communicator {self.kind} rank={self.rank} size={self.size}>"


__all__ = ["Communicator", "CudaBuffer"]
