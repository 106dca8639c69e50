"""The state dicts of a dsopt.torch optimizer: ``StateDictMixin`` is that
part of ``dsopt.torch.Optimizer``'s own code (torch's format with this
rank's dsopt state blob, whole checkpoints of every rank, torch.optim's
own format for the algorithms whose parameters count their own steps, and
loading each of them)."""

import copy
from collections.abc import Mapping

from . import _checkpoint, _groups
from ._fsdp_state import FsdpStateMixin
from ._torch_state import TorchStateMixin, is_torch_state_dict


def _fsdp_refusal(what):
    return RuntimeError(
        f"dsopt.torch: {what} over FSDP2 parameters: every rank holds its shards of the state; "
        f"checkpoint with torch.distributed.checkpoint (get_optimizer_state_dict, dcp.save / "
        f"dcp.load, set_optimizer_state_dict), which reshards to any world size "
        f"(docs/guides/fsdp2.md)")


class StateDictMixin(FsdpStateMixin, TorchStateMixin):
    """The state dict methods of ``dsopt.torch.Optimizer`` (which inherits
    them), torch.optim's own format from ``TorchStateMixin``. They use what
    ``OptimizerCore`` declares, nothing else."""

    def _pack_groups(self):
        """torch's ``param_groups`` of a state dict (parameters as indices)."""
        packed, start = [], 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            packed.append(entry)
        return packed

    def state_dict(self):
        """torch's state dict of the groups' settings (``"state"`` is
        empty) plus this rank's dsopt state blob under ``"dsopt_state"``.
        Under ZeRO the blob holds this rank's shard only: save every
        rank's. ``torch_state_dict()`` gives torch.optim's format. Over
        FSDP2 parameters: torch.optim's layout with DTensors, for
        torch.distributed.checkpoint (``_fsdp_state``)."""
        self._follow_params(collective=False)  # the blob's dtypes are the parameters'
        self._sync_hyperparameters()  # the blob saves the groups' current values
        for hook in getattr(self, "_optimizer_state_dict_pre_hooks", {}).values():
            hook(self)
        if self._shards is not None:
            state_dict = self._fsdp_state_dict()
        else:
            state_dict = {"state": {}, "param_groups": self._pack_groups(),
                          "dsopt_state": self.dsopt.state_dict()}
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def state_dict_all_ranks(self, dst=0):
        """A whole checkpoint of a run on several ranks (collective: every
        rank calls it): on rank ``dst`` ``state_dict()`` plus
        ``"dsopt_rank_states"``, the dsopt blobs of every rank in rank
        order; None on the other ranks. This is the one file to save when a
        framework saves from rank 0 only: ``load_state_dict`` of it on every
        rank loads each rank's own blob at the same world size (1-bit
        compression errors and ZeRO shards included) and reshards or resets
        at another (as ``load_state_dict_shards``). The blobs are gathered
        through torch.distributed (a torch group) or mpi4py; other
        communicators raise ValueError (save ``state_dict()`` on every
        rank). Rank ``dst`` holds every rank's blob at once."""
        if self._shards is not None:
            raise _fsdp_refusal("state_dict_all_ranks()")
        self._follow_params()  # collective here: a cast model is followed on every rank
        state_dict = self.state_dict()
        blobs = _checkpoint.gather_blobs(self._comm, state_dict["dsopt_state"], dst)
        if blobs is None:
            return None
        state_dict[_checkpoint.RANK_STATES] = blobs
        return state_dict

    def torch_state_dict(self):
        """This optimizer's state as torch.optim's own ``state_dict()``
        (an algorithm whose parameters count their own steps:
        ``dsopt.describe(type).param_steps``): torch.optim's class of the
        same name (``torch.optim.AdamW``; ``torch.optim.Adam`` for L2
        weight decay, as ``dsopt.torch.Adam``; ``torch.optim.SGD``) over
        the same parameters loads it with ``load_state_dict`` and continues
        the run. ``"state"`` maps parameter indices to the algorithm's
        moments by their names (``"exp_avg"``, ``"exp_avg_sq"``;
        ``"momentum_buffer"``), copies in the parameter's dtype and
        device, and ``"step"`` (a 0-d tensor: float32, float64 under a
        float64 default dtype) where torch's class keeps one (SGD's does
        not), for the parameters dsopt has updated; ``"param_groups"`` has
        every key of the running torch version's groups. Raises ValueError
        for the others (the 1-bit optimizers, Lamb: their state spans all
        parameters) and under ZeRO stage 1/2 on several ranks (each rank
        holds part of the state)."""
        self._follow_params(collective=False)
        if self._shards is not None:
            self._require_torch_format("export a torch.optim state dict")
            return self._fsdp_state_dict(with_dsopt=False)
        return self._export_torch_state()

    @staticmethod
    def _split(state_dict, what="state dict"):
        """(torch's part, the dsopt blob) of one of our state dicts."""
        if not isinstance(state_dict, Mapping) or state_dict.get("dsopt_state") is None:
            raise ValueError(f"{what} is not a dsopt.torch.Optimizer state dict "
                             f"(no 'dsopt_state')")
        torch_part = dict(state_dict)
        return torch_part, torch_part.pop("dsopt_state")

    def _check_groups(self, torch_part, what="state dict"):
        """torch's own checks of load_state_dict, made before dsopt changes
        anything, so a mismatch leaves both untouched."""
        groups = torch_part.get("param_groups")
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            raise ValueError(f"{what} has a different number of parameter groups")
        for i, (saved, ours) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, Mapping) or \
                    len(saved.get("params", ())) != len(ours["params"]):
                raise ValueError(f"{what}: parameter group {i} has a different number of "
                                 f"parameters")
            _groups.check_flags(saved, f"{what}: param_groups[{i}]: ", self._facts.decoupled)
            hyper = self._facts.hyper
            merged = dict(ours)
            merged.update({k: v for k, v in saved.items() if k in hyper.keys})
            hyper.values(merged, f"{what}: param_groups[{i}]: ")

    def _set_groups(self, saved_groups):
        """torch's load_state_dict: the saved groups' settings with this
        optimizer's parameters; then dsopt gets their hyperparameters."""
        groups = []
        for saved, ours in zip(copy.deepcopy(list(saved_groups)), self.param_groups):
            saved = dict(saved)
            saved["params"] = ours["params"]
            if "param_names" in ours and "param_names" not in saved:
                saved["param_names"] = ours["param_names"]
            groups.append(saved)
        self.param_groups = groups
        self._normalize_groups()
        self._reset_hyperparameters()
        self._sync_hyperparameters()

    def _restore(self, torch_part, load_dsopt):
        self._check_groups(torch_part)
        try:
            load_dsopt()
        finally:
            self.state.invalidate()  # the load rebuilds the 1-bit compression buffers
        self._set_groups(torch_part["param_groups"])

    def load_state_dict(self, state_dict, *, reset_rank_local=False):
        """Restores a state dict (collective): this rank's own
        ``state_dict()`` of a run at the same world size (see
        ``load_state_dict_shards`` for another world size or stage), which
        restores the dsopt state and the groups' settings (their
        hyperparameters handed to dsopt); a whole checkpoint of
        ``state_dict_all_ranks()`` (the same file on every rank: each rank
        takes its own blob at the saved world size, and the whole set as
        ``load_state_dict_shards`` at another); or, where
        ``torch_state_dict()`` works, a torch.optim state dict
        (``torch.optim.Adam``/``AdamW``/``SGD``: no ``"dsopt_state"``):
        its moments and step counts (1 for a parameter with state where
        torch keeps no step) are written into dsopt's state (this
        rank's part under ZeRO), its groups' settings become this
        optimizer's; load the model's parameters first (16-bit parameters'
        fp32 masters are taken from them). Not collective then. Everything
        is checked before anything changes.

        A state dict another rank saved at the same world size is
        ``dsopt.Mismatch`` when its state is partly rank-local (the 1-bit
        optimizers' compression errors, 0/1 Adam's local state, ZeRO
        shards): load this rank's own, or a whole checkpoint. With
        ``reset_rank_local=True`` the 1-bit optimizers load it anyway,
        their rank-local state reset as at a change of world size, and
        warn that they did (ZeRO shards cannot be reset)."""
        state_dict = dict(state_dict) if isinstance(state_dict, Mapping) else state_dict
        self._follow_params()  # the load writes 16-bit parameters from their masters
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        if self._shards is not None:
            self._load_fsdp_state(state_dict)
        elif is_torch_state_dict(state_dict):
            self._load_torch_state(state_dict)
        else:
            torch_part, blob = self._split(state_dict)
            blob, blobs = _checkpoint.own_blob_or_set(self._comm, blob, torch_part)
            torch_part.pop(_checkpoint.RANK_STATES, None)
            if blobs is None:
                self._restore(torch_part, lambda: _checkpoint.load_blob(
                    self.dsopt, self._facts.type, blob, reset_rank_local))
            else:
                self._restore(torch_part, lambda: self.dsopt.load_state_dict_shards(blobs))
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def load_state_dict_shards(self, state_dicts):
        """Restores a run saved at any world size from the ``state_dict()``
        of every one of its ranks, in rank order (collective: every rank
        passes the whole list). Adam/AdamW reshard the ZeRO shards (or
        stage-0 state) into this rank's shard at this optimizer's stage;
        the other optimizers load replicated state. The groups' settings
        come from ``state_dicts[0]``. A one-process run's single state dict
        is a complete list. Everything is checked before anything changes:
        dsopt rejects missing, duplicated or misordered shards and shards of
        different runs or steps (``dsopt.Mismatch``)."""
        if self._shards is not None:
            raise _fsdp_refusal("load_state_dict_shards()")
        if isinstance(state_dicts, Mapping):
            raise TypeError("load_state_dict_shards takes a list of state dicts, one per "
                            "rank of the saved run; for this rank's own use load_state_dict")
        parts = [self._split(sd, f"state_dicts[{i}]") for i, sd in enumerate(state_dicts)]
        if not parts:
            raise ValueError("load_state_dict_shards needs at least one state dict "
                             "(one per rank of the saved run)")
        blobs = [blob for _, blob in parts]
        self._follow_params()  # the load writes 16-bit parameters from their masters
        self._restore(parts[0][0], lambda: self.dsopt.load_state_dict_shards(blobs))
