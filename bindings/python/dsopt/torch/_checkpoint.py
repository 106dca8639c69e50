"""Whole checkpoints of a dsopt.torch optimizer on several ranks: every
rank's dsopt state in the one state dict that a framework saves from rank
0 (HF Trainer's ``optimizer.pt``, a Lightning checkpoint), and that dict
loaded back on every rank.

A state dict of ``state_dict_all_ranks()`` is ``state_dict()``'s plus
``"dsopt_rank_states"``: the dsopt blob of every rank, in rank order.
``load_state_dict`` takes it on every rank: at the world size it was saved
at each rank loads its own blob (rank-local state, such as the 1-bit
compression errors and the ZeRO shards, comes back exactly); at another
world size every rank loads the whole set as ``load_state_dict_shards``
does (ZeRO shards reshard; the 1-bit optimizers' rank-local state resets,
as for any change of world size)."""

import warnings

import torch

from ..errors import Mismatch

RANK_STATES = "dsopt_rank_states"


def _torch_group_rank(group, rank):
    """The global rank of ``rank`` in the torch ProcessGroup ``group``."""
    dist = torch.distributed
    if group is None or group is dist.group.WORLD:
        return rank
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, rank)
    return dist.distributed_c10d._get_global_rank(group, rank)  # torch < 2.0


def gather_blobs(comm, blob, dst):
    """Every rank's ``blob`` in rank order on rank ``dst`` of ``comm`` (a
    ``dsopt.Communicator``, or None for one process), None on the other
    ranks. Collective: a torch.distributed group gathers through
    torch.distributed, an mpi4py communicator through mpi4py; other
    communicators (NCCL handles, Fortran handles, callbacks) have no
    object collective dsopt can use: ValueError before anything is sent."""
    size = 1 if comm is None else comm.size
    rank = 0 if comm is None else comm.rank
    if isinstance(dst, bool) or not isinstance(dst, int) or not 0 <= dst < size:
        raise ValueError(f"dst must be a rank of the optimizer's communicator (0 .. {size - 1}), "
                         f"got {dst!r}")
    if size == 1:
        return [blob]
    if comm.kind == "torch":
        gathered = [None] * size if rank == dst else None
        torch.distributed.gather_object(blob, gathered, dst=_torch_group_rank(comm.group, dst),
                                        group=comm.group)
        return gathered
    mpi = comm.mpi4py_comm
    if mpi is not None:
        return mpi.gather(bytes(blob), root=dst)
    raise ValueError(
        f"state_dict_all_ranks gathers the ranks' blobs through torch.distributed or mpi4py; "
        f"this optimizer's communicator is a {comm.kind!r} one. Save state_dict() on every rank "
        f"instead (and load them with load_state_dict_shards).")


def own_blob_or_set(comm, blob, state_dict):
    """(blob, blobs): what ``load_state_dict`` restores from ``state_dict``
    on this rank of ``comm`` (the optimizer's communicator, None for one
    process):
    ``blob`` (this rank's own) when the dict has every rank's blobs of a
    run at this world size, else ``blobs`` (every rank's, for
    ``load_state_dict_shards``); ``(blob, None)`` for a dict of one rank."""
    blobs = state_dict.get(RANK_STATES)
    if blobs is None:
        return blob, None
    if not isinstance(blobs, (list, tuple)) or not blobs:
        raise ValueError(f"state dict: {RANK_STATES!r} must be a non-empty list of the "
                         f"ranks' dsopt blobs, got {type(blobs).__name__}")
    size = 1 if comm is None else comm.size
    if len(blobs) == size:
        return blobs[0 if comm is None else comm.rank], None
    return None, list(blobs)


def load_blob(optimizer, type_name, blob, reset_rank_local):
    """Loads one rank's blob into ``optimizer`` (a ``dsopt.Optimizer`` of
    the algorithm ``type_name``); with
    ``reset_rank_local`` a blob of another rank loads with the rank-local
    state reset (on every rank, so that the ranks' states still fit
    together), and a warning says so."""
    try:
        reset = optimizer.load_state_dict(blob, reset_rank_local=reset_rank_local)
    except Mismatch as error:
        if "saved by rank" not in str(error):
            raise
        raise Mismatch(f"{error}. To checkpoint every rank in one file, save "
                       f"opt.state_dict_all_ranks() (collective) from rank 0.") from None
    if reset:
        warnings.warn(
            f"dsopt.torch: a state dict saved by another rank was loaded, so the rank-local "
            f"state of {type_name} (compression errors, local state) was reset on every rank, "
            f"as at a change of world size. Save state_dict_all_ranks() to resume every rank "
            f"exactly.", RuntimeWarning, stacklevel=4)
