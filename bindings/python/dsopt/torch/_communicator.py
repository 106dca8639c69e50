"""The communicator a dsopt.torch optimizer runs on: the ``comm`` argument
(a dsopt.Communicator, an mpi4py communicator, a torch.distributed
ProcessGroup, or None: torch.distributed's default group when it is
initialized, else one process)."""

import torch

from ..communicator import Communicator


def _torch_distributed():
    """torch.distributed when this torch build has it, else None."""
    if not hasattr(torch, "distributed") or not torch.distributed.is_available():
        return None
    return torch.distributed


def _is_process_group(comm) -> bool:
    """A torch ProcessGroup, or the marker new_group returns to non-members."""
    dist = _torch_distributed()
    if dist is None:
        return False
    return isinstance(comm, dist.ProcessGroup) or \
        comm is getattr(dist.GroupMember, "NON_GROUP_MEMBER", object())


def as_communicator(comm):
    """(Communicator or None, whether the optimizer owns it) for ``comm``."""
    if isinstance(comm, Communicator):
        return comm, False
    if comm is None:
        dist = _torch_distributed()
        if dist is not None and dist.is_initialized():
            return Communicator.from_torch(), True
        return None, False
    if hasattr(comm, "py2f"):
        return Communicator.from_mpi4py(comm), True
    if _is_process_group(comm):
        return Communicator.from_torch(comm), True
    raise TypeError(f"comm must be a dsopt.Communicator, an mpi4py communicator or a "
                    f"torch.distributed ProcessGroup, got {type(comm).__name__}")
