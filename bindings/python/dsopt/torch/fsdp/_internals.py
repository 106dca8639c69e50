"""What dsopt.torch.fsdp reads of FSDP2 beyond its public API, in one
place: a ``fully_shard``ed module's parameter groups (each holds its
parameters, mesh, device and mixed-precision policy), their sizes, and the
collectives installed on them. Written against torch 2.15's
``torch/distributed/fsdp/_fully_shard``; an FSDP2 without these names
fails here with a message that says so."""

import torch

try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        DefaultAllGather,
        DefaultReduceScatter,
    )
except ImportError as exc:  # torch without FSDP2's fully_shard
    raise ImportError(
        f"dsopt.torch.fsdp needs torch's FSDP2 (torch.distributed.fsdp.fully_shard, "
        f"torch >= 2.6); this torch is {torch.__version__}: {exc}") from exc


def _unknown(what, exc):
    return RuntimeError(
        f"dsopt.torch.fsdp: this torch's FSDP2 ({torch.__version__}) has no {what} "
        f"(dsopt.torch.fsdp follows torch 2.15's): {exc}")


def fsdp_modules(model):
    """(fully qualified name, module) of every FSDPModule of ``model``,
    itself included ("" for it), in ``named_modules`` order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def param_groups(module):
    """The FSDP parameter groups of one FSDPModule (one, or several with
    per-parameter meshes from ``shard_placement_fn``; none without
    parameters)."""
    try:
        return list(module._get_fsdp_state()._fsdp_param_groups)
    except AttributeError as exc:
        raise _unknown("FSDPState._fsdp_param_groups", exc) from exc


class GroupView:
    """What dsopt.torch.fsdp needs to know of one FSDP parameter group."""

    def __init__(self, group):
        try:
            self.group = group
            self.device = group.device
            info = group.mesh_info
            self.mesh = info.mesh
            self.shard_size = getattr(info, "shard_mesh_size", 1)
            params = group.fsdp_params
            # The reduce-scatter's output: every parameter that gets a
            # gradient, each padded to an even shard.
            self.shard_numel = sum(p.padded_sharded_param_size.numel() for p in params
                                   if p.sharded_param.requires_grad)
            self.param_dtypes = {p.sharded_param.dtype for p in params}
            self.policies = [p.mp_policy for p in params]
            self.divide_factor = group.gradient_divide_factor
            self.comms = (group._reduce_scatter_comm, group._all_gather_comm)
        except AttributeError as exc:
            raise _unknown("FSDPParamGroup attribute it reads", exc) from exc


__all__ = ["AllGather", "DefaultAllGather", "DefaultReduceScatter", "FSDPModule", "GroupView",
           "ReduceScatter", "fsdp_modules", "param_groups"]
