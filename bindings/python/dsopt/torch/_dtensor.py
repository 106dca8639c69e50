"""dsopt.torch optimizers over the parameters of an FSDP2 model
(``torch.distributed.fsdp.fully_shard``, docs/guides/fsdp2.md): DTensors
cut along dim 0 over a shard group, whose local tensors (this rank's rows,
possibly none) are what dsopt updates, in one fused step per group.

``ShardedParams.of`` recognises such parameters, checks their layout
(ValueError saying what is supported) and names the communicators:

* the shard group: the process group of the mesh dimension the parameters
  are sharded over. dsopt gets it as the shard communicator of its own
  (``dsopt.Communicator.set_shards``, ``dsopt_comm_set_shards``): the
  global gradient norm (clipping), the non-finite check and LAMB's
  per-tensor norms are reduced over it;
* the replicas, over which dsopt averages the gradients (and the 1-bit
  optimizers exchange their compressed momentum): none under plain FSDP2
  (FSDP2 reduce-scatters the gradients over every rank) and under FSDP2's
  own HSDP (a 2-D mesh: FSDP2 all-reduces across replicas itself); under
  HSDP by dsopt (``fully_shard(..., mesh=mesh["shard"])`` of a 2-D mesh),
  the other dimension of the parameters' root mesh, or the ``comm``
  given (a 2-D DeviceMesh, whose first dimension it is, a ProcessGroup or
  a dsopt.Communicator).

It also turns the parameters, their gradients and dsopt's state views into
what each side takes: local tensors for dsopt (an empty shard as an empty
tensor, whose gradient is marked present, so that it counts its steps as
torch's optimizers do),
DTensors shaped and placed like the parameters for torch
(``opt.state``, state dicts, torch.distributed.checkpoint)."""

import torch

from ..communicator import Communicator
from ._communicator import as_communicator

_GUIDE = "docs/guides/fsdp2.md"


def dtensor_types():
    """(DTensor, Shard, Replicate) of this torch, or None without DTensor."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:
        try:
            from torch.distributed._tensor import DTensor, Replicate, Shard
        except ImportError:
            return None
    return DTensor, Shard, Replicate


def _is_dtensor(tensor, types):
    return types is not None and isinstance(tensor, types[0])


def _placement_text(placements):
    return "(" + ", ".join(map(str, placements)) + ")"


class ShardedParams:
    """The FSDP2 parameters of one optimizer (see the module doc), in the
    optimizer's parameter order."""

    def __init__(self, params, mesh, shard_dim, native_hsdp):
        self.params = params
        self.mesh = mesh
        self.shard_dim = shard_dim  # the mesh dimension the tensors are cut over
        self.native_hsdp = native_hsdp  # FSDP2 all-reduces across mesh dim 0 itself
        self.placements = tuple(params[0].placements)
        self._present = None  # memory whose address marks an empty gradient present
        self.replica_mesh = None  # the 2-D mesh (replicas, shards) of HSDP by dsopt

    # ---- recognising FSDP2's parameters -----------------------------------

    @classmethod
    def of(cls, tensors, facts, overlap):
        """The ``ShardedParams`` of ``tensors`` (an optimizer's parameters),
        None when none is a DTensor; ValueError for layouts dsopt cannot
        update (mixed with plain tensors, several meshes, placements other
        than FSDP2's) and for what has no meaning on them (ZeRO,
        overlap=True)."""
        types = dtensor_types()
        flags = [_is_dtensor(p, types) for p in tensors]
        if not any(flags):
            return None
        if not all(flags):
            i = flags.index(False)
            raise ValueError(
                f"dsopt.torch: parameter {i} (shape {tuple(tensors[i].shape)}) is a plain tensor "
                f"while others are DTensors (FSDP2's): dsopt takes the parameters of one "
                f"fully_shard'ed model, every one a DTensor; apply fully_shard to the root module "
                f"too ({_GUIDE})")
        mesh = tensors[0].device_mesh
        for i, p in enumerate(tensors):
            if p.device_mesh != mesh:
                raise ValueError(
                    f"dsopt.torch: parameter {i} is on the device mesh {p.device_mesh}, parameter "
                    f"0 on {mesh}: one dsopt optimizer takes parameters of one mesh (make one "
                    f"optimizer per mesh)")
        _, Shard, Replicate = types
        if mesh.ndim == 1:
            wanted = (Shard(0),)
        elif mesh.ndim == 2:
            wanted = (Replicate(), Shard(0))
        else:
            wanted = None
        for i, p in enumerate(tensors):
            if wanted is None or tuple(p.placements) != wanted:
                raise ValueError(
                    f"dsopt.torch: parameter {i} is a DTensor placed {_placement_text(p.placements)} "
                    f"on a {mesh.ndim}-D mesh; dsopt updates FSDP2's layouts: (Shard(dim=0),) on a "
                    f"1-D mesh (fully_shard) or (Replicate(), Shard(dim=0)) on a 2-D mesh "
                    f"(fully_shard's HSDP), each rank's rows of every tensor ({_GUIDE})")
        if facts.zero_stage > 0:
            raise ValueError(
                f"dsopt.torch: zero_stage {facts.zero_stage} on FSDP2 parameters: FSDP2 shards "
                f"the parameters, gradients and optimizer state already (each rank keeps the "
                f"state of its own shards); leave ZeRO off")
        if overlap:
            raise ValueError(
                "dsopt.torch: overlap=True on FSDP2 parameters: FSDP2 reduce-scatters the "
                "gradients during backward itself, and dsopt steps on the shards after it; "
                "leave overlap off")
        return cls(list(tensors), mesh, mesh.ndim - 1, mesh.ndim == 2)

    # ---- communicators -------------------------------------------------------

    def communicator(self, comm, facts):
        """(the dsopt communicator of the replicas with the shard group set
        on it, whether the optimizer owns it). See the module doc for
        ``comm``; ValueError where the 1-bit optimizers would have nothing
        to exchange (plain FSDP2, FSDP2's own HSDP)."""
        replicas = self._replicas(comm)
        try:
            self._check_replicas(facts.algorithm, replicas, comm)
        except BaseException:
            if replicas is not None and replicas[1]:
                replicas[0].close()
            raise
        shards = Communicator.from_torch(self.mesh.get_group(self.shard_dim))
        if replicas is None:
            main, owned = Communicator.local(), True
        else:
            main, owned = replicas
        try:
            main.set_shards(shards, close_with=True)
        except BaseException:
            shards.close()
            if owned:
                main.close()
            raise
        return main, owned

    def _check_replicas(self, algorithm, replicas, comm):
        """ValueError where ``algorithm`` cannot run on these replicas: a
        1-bit optimizer needs several, and the (replicate, shard) mesh for
        its rank-local state's checkpoints."""
        size = 1 if replicas is None else replicas[0].size
        if algorithm.compressed and size > 1 and self.replica_mesh is None:
            raise ValueError(
                f"dsopt.torch: {algorithm.type} on FSDP2 parameters with replicas from comm "
                f"{type(comm).__name__}: its rank-local state (compression errors) is "
                f"checkpointed over the (replicate, shard) mesh; give comm as that 2-D "
                f"DeviceMesh, or shard the model over a slice of one ({_GUIDE})")
        if algorithm.compressed and size <= 1:
            if self.native_hsdp:
                why = ("under FSDP2's own HSDP (a 2-D mesh) FSDP2 all-reduces the gradients across "
                       "the replicas itself, so dsopt would compress gradients already averaged")
            else:
                why = ("under plain FSDP2 every rank holds a different shard and FSDP2 has "
                       "averaged the gradients over all of them (reduce-scatter): there are no "
                       "replicas for the 1-bit exchange")
            raise ValueError(
                f"dsopt.torch: {algorithm.type} on FSDP2 parameters: {why}. Use HSDP with dsopt "
                f"across the replicas: a 2-D mesh init_device_mesh(..., (replicas, shards), "
                f"mesh_dim_names=('replicate', 'shard')), fully_shard(..., mesh=mesh['shard']) "
                f"and the optimizer over model.parameters() (it takes the replicas from the "
                f"mesh) ({_GUIDE})")

    def _replicas(self, comm):
        """(dsopt communicator of the replicas, owned) or None (one replica)."""
        import torch.distributed as dist

        if self.native_hsdp:
            if comm is not None:
                raise ValueError(
                    "dsopt.torch: comm on FSDP2 parameters of a 2-D mesh (fully_shard's HSDP): "
                    "FSDP2 averages the gradients across the replicas itself, so dsopt has no "
                    "communicator of its own; leave comm None")
            return None
        shard_ranks = dist.get_process_group_ranks(self.mesh.get_group(0))
        if comm is None:
            root = self.mesh._get_root_mesh() if hasattr(self.mesh, "_get_root_mesh") else None
            if root is None or root is self.mesh or root.ndim == 1:
                return None
            if root.ndim != 2:
                raise ValueError(
                    f"dsopt.torch: the parameters' mesh is a slice of a {root.ndim}-D mesh; dsopt "
                    f"takes its replicas from a 2-D (replicate, shard) mesh: pass comm= the "
                    f"process group to average the gradients over ({_GUIDE})")
            comm = root
        if type(comm).__name__ == "DeviceMesh":
            if comm.ndim != 2:
                raise ValueError(f"dsopt.torch: comm is a {comm.ndim}-D DeviceMesh; give the 2-D "
                                 f"(replicate, shard) mesh whose shard dimension the parameters "
                                 f"are sharded over")
            mine = dist.get_process_group_ranks(comm.get_group(1))
            if mine != shard_ranks:
                raise ValueError(
                    f"dsopt.torch: comm's second dimension holds ranks {mine} here, the parameters "
                    f"are sharded over ranks {shard_ranks}: give the 2-D mesh whose 'shard' "
                    f"dimension the model was fully_shard'ed over")
            self.replica_mesh = comm
            comm = comm.get_group(0)
        made, owned = as_communicator(comm)
        if made is None:
            return None
        return made, owned

    # ---- what dsopt and torch each take ----------------------------------------

    def locals(self, tensors=None):
        """The local tensors dsopt updates for the parameters ``tensors``
        (default: all), in order; an empty shard has numel 0 and data NULL,
        which a sharded dsopt optimizer takes."""
        return [p._local_tensor for p in (self.params if tensors is None else tensors)]

    def local_shape(self, p):
        return p._local_tensor.shape

    def grad(self, p):
        """``p.grad``'s local tensor (None: no gradient), contiguous."""
        grad = p.grad
        if grad is None:
            return None
        if grad.is_sparse:
            raise RuntimeError("dsopt.torch.Optimizer does not support sparse gradients")
        local = grad._local_tensor if _is_dtensor(grad, dtensor_types()) else None
        if local is None:
            raise RuntimeError(
                f"dsopt.torch: a parameter of shape {tuple(p.shape)} is a DTensor but its .grad "
                f"is a plain {type(grad).__name__}: FSDP2 gives DTensor gradients; assign .grad "
                f"as DTensors placed like the parameters")
        return local.contiguous()

    def grads(self, tensors):
        return [self.grad(p) for p in tensors]

    def mark_present(self, records, grads):
        """Gives the empty gradients among ``grads`` (described with data
        NULL: torch has no address for an empty tensor) an address, so that
        dsopt counts them present (an empty shard steps with the others, as
        torch's optimizers count its steps) rather than absent."""
        if self._present is None:  # on dsopt's device (never read: numel 0)
            self._present = torch.empty(1, device=self.params[0]._local_tensor.device)
        address = self._present.untyped_storage().data_ptr()
        data, numel = records["data"], records["numel"]
        for i, g in enumerate(grads):
            if g is not None and numel[i] == 0 and data[i] == 0:
                data[i] = address

    def wrap(self, p, local):
        """``local`` (shaped like ``p``'s local tensor) as a DTensor placed
        like ``p``."""
        DTensor = dtensor_types()[0]
        return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                  shape=p.shape, stride=p.stride())

    def part_of(self, p, value):
        """This rank's part of ``value`` for parameter ``p``, shaped like
        its local tensor: a DTensor placed like ``p`` gives its local
        tensor; another DTensor its whole tensor first (collective); a
        plain tensor is taken as the whole tensor."""
        if _is_dtensor(value, dtensor_types()):
            if value.device_mesh == p.device_mesh and \
                    tuple(value.placements) == tuple(p.placements):
                return value._local_tensor
            value = value.full_tensor()
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        if tuple(value.shape) != tuple(p.shape):
            return None
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
        return value[index]

    # ---- the layout, for state dicts ---------------------------------------------

    def topology(self, comm):
        """[replicas, shards] of the run (the layout rank-local state belongs to)."""
        shards = comm.shards.size if comm.shards is not None else 1
        return [comm.size, shards]

    def shard_numels(self):
        """For each rank of the shard group, the numel of its shard of every
        parameter (FSDP2 cuts dim 0 as torch.chunk does: ceil(rows / S)
        rows each, the last ones fewer or none)."""
        shards = self.mesh.size(self.shard_dim)
        out = []
        for s in range(shards):
            numels = []
            for p in self.params:
                rows = p.shape[0] if p.dim() else 1
                per = -(-rows // shards)
                held = max(0, min(rows, (s + 1) * per) - s * per)
                numels.append(held * (p.numel() // max(rows, 1)))
            out.append(numels)
        return out

    def rank_local_tensor(self, data, width):
        """The bytes ``data`` of every rank as one uint8 DTensor of shape
        (replicas, shards, 8 + ``width``) on the (replicate, shard) mesh,
        each rank holding its own row: a length, the bytes, zeros; ``width``
        is the same on every rank, so that a state dict made to load into
        has the shape of one saved at any stage."""
        import struct

        if len(data) > width:
            raise RuntimeError(f"dsopt.torch: this rank's rank-local state has {len(data)} bytes, "
                               f"more than its bound {width} (_fsdp_state.rank_local_bound)")
        mesh = self.replica_mesh
        _, Shard, _ = dtensor_types()
        device = torch.device("cuda", torch.cuda.current_device()) \
            if mesh.device_type == "cuda" else torch.device("cpu")
        width = 8 + width
        row = bytearray(width)
        row[:8] = struct.pack("<q", len(data))
        row[8:8 + len(data)] = data
        local = torch.frombuffer(row, dtype=torch.uint8).reshape(1, 1, width).to(device)
        replicas, shards = mesh.shape
        return dtensor_types()[0].from_local(local, mesh, (Shard(0), Shard(1)), run_check=False,
                                             shape=(replicas, shards, width),
                                             stride=(shards * width, width, 1))

    @staticmethod
    def rank_local_bytes(value):
        """This rank's bytes of a ``rank_local_tensor``."""
        import struct

        local = value._local_tensor if _is_dtensor(value, dtensor_types()) else value
        row = bytes(local.reshape(-1).cpu().numpy())
        (length,) = struct.unpack_from("<q", row, 0)
        return row[8:8 + length]


def refuse_rebuild(what):
    """The RuntimeError of what would rebuild dsopt's optimizer over FSDP2
    parameters (dsopt cannot carry their sharded state into another one)."""
    return RuntimeError(
        f"dsopt.torch: {what} on FSDP2 parameters is not supported: dsopt's optimizer would be "
        f"rebuilt, and it takes the FSDP2 layout only at creation. Create the optimizer with "
        f"every parameter group, after fully_shard and after moving or casting the model "
        f"({_GUIDE})")
