"""The communicator a dsopt.torch optimizer runs on: the ``comm`` argument
(a dsopt.Communicator, an mpi4py communicator, a torch.distributed
ProcessGroup, or None: torch.distributed's default group when it is
initialized, else one process).

Node-aware collectives on torch.distributed (``node_groups``): dsopt cannot
split a torch communicator, so where the optimizer has compressed
collectives (the 1-bit optimizers, compressed ZeRO), the config's
``"topology"`` ``"hierarchy"`` is ``"node_aware"`` (or ``"auto"``, the
default, and the ranks span several nodes of more than one rank) and the
communicator is the default group's, the node and rail groups are made here
with ``torch.distributed.new_group`` and given to dsopt
(``Communicator.set_nodes``). The nodes: the config's
``"ranks_per_node"`` R (rank r on node r // R, as dsopt declares them); else
torchrun's ``LOCAL_WORLD_SIZE`` where it divides the world (and
``GROUP_WORLD_SIZE`` nodes of it make the world, where set): torchrun
numbers the ranks of a node contiguously; else, under ``"node_aware"`` only,
the host names, gathered over the default group (nodes in the order of
their lowest rank, local indices in rank order; nodes of unequal sizes:
none made). Where no nodes are made dsopt runs flat (``"auto"``) or fails
to create the optimizer as for any communicator it cannot split
(``"node_aware"``).
"""

import os
import socket

import torch

from ..algorithms import describe
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


def node_of_ranks(dist, ranks_per_node=0, discover=True):
    """The node of every rank of the default group (a list), by the rule of
    this module's doc; None where it finds none (no declaration and no
    LOCAL_WORLD_SIZE with `discover` false; nodes of unequal sizes). Only
    the host names are collective (over the default group)."""
    world = dist.get_world_size()
    if ranks_per_node:
        return [r // int(ranks_per_node) for r in range(world)]
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    nodes = os.environ.get("GROUP_WORLD_SIZE", "")
    if local.isdigit() and int(local) >= 1 and world % int(local) == 0 and \
            (not nodes.isdigit() or int(nodes) * int(local) == world):
        return [r // int(local) for r in range(world)]
    if not discover:
        return None
    every = [None] * world
    dist.all_gather_object(every, socket.gethostname())
    first = {}
    of = [first.setdefault(host, len(first)) for host in every]
    counts = [of.count(k) for k in range(len(first))]
    return of if len(set(counts)) == 1 else None


def node_groups(dist, nodes):
    """(node group, rail group) of this rank for the node of every rank:
    every node's group, then every local index's, made on every rank in the
    same order (torch.distributed.new_group is collective over the default
    group)."""
    members = {}
    for r, k in enumerate(nodes):
        members.setdefault(k, []).append(r)
    order = [members[k] for k in sorted(members)]
    per_node = len(order[0])
    node_pgs = [dist.new_group(m) for m in order]
    rail_pgs = [dist.new_group([m[j] for m in order]) for j in range(per_node)]
    me = dist.get_rank()
    k = sorted(members).index(nodes[me])
    return node_pgs[k], rail_pgs[order[k].index(me)]


def _wants_nodes(canonical):
    """(hierarchy, ranks_per_node) of the canonical config's "topology";
    hierarchy "flat" where the optimizer has no compressed collectives."""
    if not canonical:
        return "flat", 0
    compression = (canonical.get("zero_optimization") or {}).get("compression") or {}
    compresses = describe(canonical["optimizer"]["type"]).compressed or any(
        compression.get(k, "none") != "none" for k in ("gradients", "parameters"))
    topology = canonical.get("topology") or {}
    return (topology.get("hierarchy", "auto") if compresses else "flat"), topology.get("ranks_per_node", 0)


def _with_node_groups(comm, canonical):
    """Gives a from_torch communicator of the default group its node and
    rail groups where the canonical config asks for the node-aware
    collectives."""
    hierarchy, ranks_per_node = _wants_nodes(canonical)
    dist = _torch_distributed()
    if hierarchy not in ("node_aware", "auto") or dist is None or dist.get_world_size() < 2:
        return comm
    nodes = node_of_ranks(dist, ranks_per_node, discover=hierarchy == "node_aware")
    if nodes is None:
        return comm  # none found, or unequal nodes: dsopt runs flat
    n, r = len(set(nodes)), len(nodes) // len(set(nodes))
    if hierarchy == "auto" and (n < 2 or r < 2):
        return comm
    node_pg, rail_pg = node_groups(dist, nodes)
    stream = comm.torch_collectives.stream if comm.torch_collectives else None
    node = Communicator.from_torch(node_pg, stream=stream)
    rail = Communicator.from_torch(rail_pg, stream=stream)
    comm.set_nodes(node, rail, close_with=True)
    return comm


def _is_default_group(dist, group):
    return group is None or group is getattr(dist.GroupMember, "WORLD", None) or \
        group is getattr(dist.distributed_c10d, "_get_default_group", lambda: None)()


def as_communicator(comm, canonical=None):
    """(Communicator or None, whether the optimizer owns it) for ``comm``;
    a process group of the default group's ranks gets its node and rail
    groups where the canonical config asks for them (node_groups)."""
    if isinstance(comm, Communicator):
        return comm, False
    if comm is None:
        dist = _torch_distributed()
        if dist is not None and dist.is_initialized():
            return _with_node_groups(Communicator.from_torch(), canonical), True
        return None, False
    if hasattr(comm, "py2f"):
        return Communicator.from_mpi4py(comm), True
    if _is_process_group(comm):
        made = Communicator.from_torch(comm)
        if _is_default_group(_torch_distributed(), comm):
            made = _with_node_groups(made, canonical)
        return made, True
    raise TypeError(f"comm must be a dsopt.Communicator, an mpi4py communicator or a "
                    f"torch.distributed ProcessGroup, got {type(comm).__name__}")
