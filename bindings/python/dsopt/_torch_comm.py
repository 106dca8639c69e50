"""torch.distributed behind a dsopt communicator (``Communicator.from_torch``).

``TorchCollectives`` implements the four collectives of
``Communicator.from_callbacks(buffers="torch")`` with torch.distributed on
one process group. dsopt's buffers arrive as tensors on its memory
(``torch_buffer``: ``torch.frombuffer`` on host memory, the CUDA array
interface on device memory), so nothing is copied unless the backend cannot
take the memory where it is (gloo and MPI: host tensors only, NCCL: CUDA
tensors only); then a copy on the other side is used.

What a backend or torch version lacks is made of other collectives, decided
once per communicator the first time the backend says it does not support
the operation (the same on every rank, and before anything is sent):

* allgather: ``all_gather_into_tensor`` (torch >= 1.13, ``_all_gather_base``
  before), else ``all_gather`` into views of the output;
* reduce-scatter: ``reduce_scatter_tensor`` (``_reduce_scatter_base``),
  else ``all_reduce`` of a copy and this rank's block of it (gloo);
* alltoall: ``all_to_all_single``, else ``all_gather`` of every rank's
  whole send buffer and the blocks meant for this rank.
"""

import torch
import torch.distributed as dist

from ._callback_comm import ELEM_DTYPES
from ._device_array import CudaBuffer
from ._lib import ffi, lib

TORCH_DTYPES = {
    lib.DSOPT_COMM_FLOAT32: torch.float32,
    lib.DSOPT_COMM_FLOAT64: torch.float64,
    lib.DSOPT_COMM_INT32: torch.int32,
    lib.DSOPT_COMM_INT64: torch.int64,
    lib.DSOPT_COMM_UINT8: torch.uint8,
}

# Backends whose collectives take tensors on one side only.
_HOST_ONLY = {"gloo", "mpi"}
_DEVICE_ONLY = {"nccl"}


def torch_buffer(ptr, count, elem, device, writable, stream, where=None):
    """A tensor on dsopt's buffer, without a copy: CPU through
    ``torch.frombuffer``, CUDA (on ``where``, a torch.device; None: the
    current device) through the CUDA array interface.

    A send buffer (``writable`` False) reaches torch as a writable array:
    torch refuses read-only CUDA arrays ("the read only flag is not
    supported"), and none of the collectives below writes to its send
    tensor (the fallbacks that need to change one work on a clone)."""
    dtype = TORCH_DTYPES[elem]
    if device == lib.DSOPT_COMM_CUDA:
        address = int(ffi.cast("uintptr_t", ptr))
        if where is None:
            where = torch.device("cuda", torch.cuda.current_device())
        tensor = torch.as_tensor(CudaBuffer(address, count, ELEM_DTYPES[elem], False, stream),
                                 device=where)
        if tensor.data_ptr() != address:
            raise RuntimeError(f"dsopt's device buffer at {address:#x} is not on {where} (the "
                               f"communicator's device): create the communicator with the "
                               f"optimizer's device current")
        return tensor
    nbytes = count * ELEM_DTYPES[elem].itemsize
    return torch.frombuffer(ffi.buffer(ffi.cast("char *", ptr), nbytes), dtype=dtype)


def resolve_group(group):
    """(group, rank, size) of a ProcessGroup (None: the default group) this
    process belongs to; clear errors otherwise."""
    if not dist.is_available():
        raise RuntimeError("dsopt.Communicator.from_torch: this torch build has no "
                           "torch.distributed")
    if not dist.is_initialized():
        raise RuntimeError("dsopt.Communicator.from_torch: torch.distributed is not initialised; "
                           "call torch.distributed.init_process_group(...) first")
    non_member = getattr(dist.GroupMember, "NON_GROUP_MEMBER", None)
    if group is None:
        group = dist.group.WORLD
    elif group is non_member:
        raise ValueError(f"dsopt.Communicator.from_torch: this process (global rank "
                         f"{dist.get_rank()}) is not a member of the process group (new_group "
                         f"returned GroupMember.NON_GROUP_MEMBER here)")
    elif not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"dsopt.Communicator.from_torch: group must be a "
                        f"torch.distributed.ProcessGroup or None, got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"dsopt.Communicator.from_torch: this process (global rank "
                         f"{dist.get_rank()}) is not a member of the process group")
    return group, rank, dist.get_world_size(group)


def _unsupported(error) -> bool:
    """Whether a RuntimeError of a collective says the backend lacks it (as
    opposed to a timeout or a lost peer)."""
    text = str(error).lower()
    return "support" in text and "time" not in text


def _first(*names):
    for name in names:
        fn = getattr(dist, name, None)
        if fn is not None:
            return fn
    return None


class TorchCollectives:
    """dsopt's collectives on a torch.distributed process group; the
    callables of ``callbacks()`` take torch tensors."""

    def __init__(self, group=None, stream=None):
        self.group, self.rank, self.size = resolve_group(group)
        self.backend = str(dist.get_backend(self.group)).lower()
        if stream is None and torch.cuda.is_available() and (
                self.backend in _DEVICE_ONLY or torch.cuda.is_initialized()):
            stream = torch.cuda.current_stream()
        self.stream = stream
        # The CUDA device of dsopt's buffers: the stream's (None until a
        # stream or an optimizer's parameters say; then the current one).
        self.device = getattr(stream, "device", None) if isinstance(stream, torch.cuda.Stream) \
            else None
        self._allgather_base = _first("all_gather_into_tensor", "_all_gather_base")
        self._reduce_scatter_base = _first("reduce_scatter_tensor", "_reduce_scatter_base")
        self._alltoall_base = _first("all_to_all_single")
        self.fallbacks = set()  # the operations made of others here
        self._ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def buffer(self, ptr, count, elem, device, writable, stream):
        """``torch_buffer`` on this communicator's CUDA device."""
        return torch_buffer(ptr, count, elem, device, writable, stream, self.device)

    def bind_device(self, device):
        """Records ``device`` (a CUDA torch.device: an optimizer's
        parameters) as this communicator's; ValueError, before anything is
        sent, when its stream is on another device."""
        device = torch.device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self.device is not None and self.device != device:
            raise ValueError(
                f"dsopt.Communicator.from_torch: the communicator works on {self.device} (its "
                f"stream's device, the current device when it was created), the parameters are "
                f"on {device}: create it with the parameters' device current "
                f"(torch.cuda.set_device({device.index}) first), or pass stream= a stream of "
                f"{device}")
        self.device = device

    def release(self):
        """Drops the process group once the communicator is destroyed (no
        collective comes after), so that this object, if it outlives the
        communicator in a garbage cycle, does not keep the group alive."""
        self.group = None

    def callbacks(self) -> dict:
        return {"allreduce": self.allreduce, "reduce_scatter": self.reduce_scatter,
                "allgather": self.allgather, "alltoall": self.alltoall}

    def __repr__(self):
        return (f"<dsopt TorchCollectives {self.backend} rank={self.rank} size={self.size} "
                f"fallbacks={sorted(self.fallbacks)}>")

    # ---- where a tensor can go -----------------------------------------------

    def _stream_for(self, tensor):
        """The CUDA stream context for a collective on ``tensor`` (device
        memory: dsopt's stream; host: none)."""
        if not tensor.is_cuda:
            return _NoStream
        stream = self.stream
        if stream is None or not isinstance(stream, torch.cuda.Stream):
            if stream not in (None, 0):
                stream = torch.cuda.ExternalStream(int(getattr(stream, "cuda_stream", stream)))
            else:
                stream = torch.cuda.default_stream(tensor.device)
            self.stream = stream
        return torch.cuda.stream(stream)

    def _staged(self, tensor):
        """``tensor``, or a copy where this backend can take it."""
        if tensor.is_cuda and self.backend in _HOST_ONLY:
            return tensor.cpu()
        if not tensor.is_cuda and self.backend in _DEVICE_ONLY:
            return tensor.to(self.device or torch.device("cuda", torch.cuda.current_device()))
        return tensor

    def _run(self, fn, send, recv):
        """``fn(send, recv)`` on tensors the backend takes, on dsopt's
        stream; a staged ``recv`` is copied back."""
        with self._stream_for(recv):
            recv_b = self._staged(recv)
            send_b = recv_b if send is recv else self._staged(send)
            fn(send_b, recv_b)
            if recv_b is not recv:
                recv.copy_(recv_b)

    def _native_or(self, name, native, fallback, send, recv):
        if native is not None and name not in self.fallbacks:
            try:
                return self._run(native, send, recv)
            except RuntimeError as error:
                if not _unsupported(error):
                    raise
                self.fallbacks.add(name)
        return self._run(fallback, send, recv)

    # ---- the collectives -----------------------------------------------------

    def allreduce(self, send, recv, op):
        def run(send, recv):
            if send is not recv:
                recv.copy_(send)
            dist.all_reduce(recv, op=self._ops[op], group=self.group)

        self._run(run, send, recv)

    def allgather(self, send, recv):
        def native(send, recv):
            self._allgather_base(recv, send, group=self.group)

        def fallback(send, recv):
            dist.all_gather(list(recv.chunk(self.size)), send, group=self.group)

        self._native_or("allgather", self._allgather_base and native, fallback, send, recv)

    def reduce_scatter(self, send, recv, op):
        red = self._ops[op]

        def native(send, recv):
            self._reduce_scatter_base(recv, send, op=red, group=self.group)

        def fallback(send, recv):
            total = send.clone()
            dist.all_reduce(total, op=red, group=self.group)
            recv.copy_(total.chunk(self.size)[self.rank])

        self._native_or("reduce_scatter", self._reduce_scatter_base and native, fallback,
                        send, recv)

    def alltoall(self, send, recv):
        def native(send, recv):
            self._alltoall_base(recv, send, group=self.group)

        def fallback(send, recv):
            everything = send.new_empty(self.size * send.numel())
            dist.all_gather(list(everything.chunk(self.size)), send, group=self.group)
            mine = everything.view(self.size, self.size, -1)[:, self.rank]
            recv.view(self.size, -1).copy_(mine)

        self._native_or("alltoall", self._alltoall_base and native, fallback, send, recv)


class _NoStreamContext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NoStream = _NoStreamContext()
