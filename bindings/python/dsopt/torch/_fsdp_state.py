"""The state dicts of a dsopt.torch optimizer over FSDP2 parameters
(docs/guides/fsdp2.md "Checkpoints"), laid out as torch.optim's are under
FSDP2, so that ``torch.distributed.checkpoint`` (``get_optimizer_state_dict``
/ ``set_optimizer_state_dict``, ``dcp.save`` / ``dcp.load``) saves them and
reshards them to another world size::

    {"state": {i: {"step": tensor(12.),        # 0-d float32, as torch's
                   "exp_avg": DTensor, ...,     # the algorithm's moments by
                                                # their torch names, placed
                                                # like parameter i
                   "master": DTensor,           # fp32 masters of 16-bit parameters
                   "exp_avg_sq_fresh": DTensor}},   # 1-bit LAMB's
     "param_groups": [{<the group's settings>, "params": [...],
                       "dsopt": {"format": 1, "algorithm": "AdamW",   # group 0
                                 "topology": [replicas, shards],
                                 "common": <bytes>},
                       "dsopt_rank_local_<R>x<S>": DTensor}, ...]}   # 1-bit only

The tensors are views of dsopt's own state (no copy): ``dcp.load`` into a
state dict of this optimizer writes into dsopt's memory, as it writes into
torch.optim's state tensors. ``"common"`` is the rest of dsopt's state
blob that every rank holds alike (step counts, hyperparameters, the loss
scaler, the 1-bit optimizers' stage and LAMB coefficients);
``dsopt_rank_local_<R>x<S>`` (the 1-bit optimizers: compression errors,
0/1 Adam's accumulator) is every rank's own, one row per rank of the
(replicate, shard) mesh, and belongs to that topology: loaded at the same
one, reset (with a warning, as dsopt resets it at another world size)
at another, where it is missing from the checkpoint (dcp.load then needs
``DefaultLoadPlanner(allow_partial_load=True)``).

``load_state_dict`` also takes torch.optim's own state dicts of the same
FSDP2 model (``torch.optim.AdamW``'s, ``get_optimizer_state_dict`` of it):
moments and steps, fp32 masters from the parameters."""

import math
import warnings
from collections.abc import Mapping

import torch

from ._blob import Blob, pack_sections, section_kind, unpack_sections
from ._core import OptimizerCore
from ._live_state import _step_dtype
from ._torch_state import _step_of

FORMAT = 1
INFO_KEY = "dsopt"
RANK_LOCAL_PREFIX = "dsopt_rank_local_"

# state view names that are rank-local (kept in the rank-local row, not
# per parameter: the replicas' differ)
_RANK_LOCAL_VIEWS = ("worker_error",)


def _padded(n, world):
    """The compressed allreduce's padded length of n elements at ``world``
    ranks (src/comm/compressed_allreduce.cpp)."""
    divider = 8 * world // math.gcd(world, 8)
    unit = world * divider
    return n if n % unit == 0 else n + unit - n % unit


def rank_local_bound(numels, replicas):
    """An upper bound, in bytes, of a 1-bit optimizer's rank-local sections
    over parameters of ``numels`` elements at ``replicas`` ranks, whatever
    its stage (the errors exist only once it compresses) and whichever of
    them it is: the worker and server errors of its compressed allreduce,
    per tensor or of the fused buffer with its padding tail, and two more
    arrays of every element (0/1 Adam's accumulator and anchor), plus the
    sections' names and lengths."""
    total = sum(numels)
    per_tensor = sum(_padded(n, replicas) for n in numels if n)
    fused = _padded(total, replicas) if total else 0
    errors = max(per_tensor + per_tensor // replicas, fused + fused // replicas + (fused - total))
    return 4 * (errors + 2 * total) + 1024


def rank_local_key(topology):
    return f"{RANK_LOCAL_PREFIX}{topology[0]}x{topology[1]}"


def _is_dsopt_key(key):
    return key == INFO_KEY or (isinstance(key, str) and key.startswith(RANK_LOCAL_PREFIX))


class FsdpStateMixin(OptimizerCore):
    """``state_dict`` / ``load_state_dict`` of ``dsopt.torch.Optimizer``
    over FSDP2 parameters (``StateDictMixin`` hands them over here)."""

    def _fsdp_state_dict(self, with_dsopt=True):
        """The state dict of the module doc (``with_dsopt`` False: without
        dsopt's keys, torch.optim's format)."""
        algorithm = self._facts.algorithm
        state = {}
        for i in range(len(self._tensors)):
            if not self.state.has_state(i):
                continue
            views, _ = self.state.views(i, strict=True)
            entry = {"step": torch.tensor(float(self.dsopt.param_step(i)), dtype=_step_dtype())}
            entry.update((k, v) for k, v in views.items() if k not in _RANK_LOCAL_VIEWS)
            state[i] = entry
        groups = self._pack_groups()
        if with_dsopt and groups:
            sections = Blob(self.dsopt.state_dict()).sections
            topology = self._shards.topology(self._comm)
            groups[0][INFO_KEY] = {
                "format": FORMAT, "algorithm": algorithm.type, "topology": topology,
                "common": pack_sections({n: b for n, b in sections.items()
                                         if section_kind(n) == "common"})}
            if algorithm.compressed:
                mine = pack_sections({n: b for n, b in sections.items()
                                      if section_kind(n) == "rank_local"})
                width = max(rank_local_bound(numels, topology[0])
                            for numels in self._shards.shard_numels())
                groups[0][rank_local_key(topology)] = self._shards.rank_local_tensor(mine, width)
        return {"state": state, "param_groups": groups}

    def _fsdp_entries(self, state_dict):
        """{parameter index: its saved state} (keys matched by position in
        the saved groups, as torch.optim does: indices or, from
        torch.distributed.checkpoint, names), the groups checked."""
        what = "FSDP2 state dict"
        groups = state_dict.get("param_groups")
        state = state_dict.get("state")
        if not isinstance(state, Mapping):
            raise ValueError(f"{what}: 'state' must be a dict")
        self._check_groups({"param_groups": groups}, what)
        ids = [k for g in groups for k in g["params"]]
        position = {}
        for i, key in enumerate(ids):
            position.setdefault(key, i)
        entries = {}
        for key, entry in state.items():
            if key not in position:
                raise ValueError(f"{what}: 'state' has an entry for parameter {key!r}, which no "
                                 f"parameter group lists")
            if not isinstance(entry, Mapping):
                raise ValueError(f"{what}: state[{key!r}] must be a dict")
            if entry:
                entries[position[key]] = entry
        return entries

    def _fsdp_parts(self, entries):
        """[(view, this rank's part)] of every saved per-element tensor,
        checked before anything is written (ValueError), and the indices of
        16-bit parameters whose masters were not saved."""
        writes, masters_from_params = [], []
        for i, p in enumerate(self._tensors):
            views, _ = self.state.views(i, strict=True)
            entry = entries.get(i, {})
            for name, view in views.items():
                if name in _RANK_LOCAL_VIEWS:
                    continue
                value = entry.get(name)
                if value is None:
                    if name == "master":
                        masters_from_params.append(i)
                    elif entry:
                        raise ValueError(f"FSDP2 state dict: state of parameter {i} lacks "
                                         f"{name!r}")
                    continue
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"FSDP2 state dict: state[{i}][{name!r}] must be a tensor, "
                                     f"got {type(value).__name__}")
                part = self._shards.part_of(p, value)
                target = view._local_tensor
                if part is None or tuple(part.shape) != tuple(target.shape):
                    raise ValueError(f"FSDP2 state dict: state[{i}][{name!r}] has shape "
                                     f"{tuple(value.shape)}; parameter {i} has shape "
                                     f"{tuple(p.shape)}")
                writes.append((target, part))
        return writes, masters_from_params

    def _load_fsdp_state(self, state_dict):
        """``load_state_dict`` over FSDP2 parameters (see the module doc):
        everything checked, then dsopt's blob of this rank made from its
        current one with the saved common (and, at the same topology,
        rank-local) sections, loaded, and the per-element state written
        through the views."""
        state_dict = dict(state_dict)
        groups = state_dict.get("param_groups")
        if not isinstance(groups, (list, tuple)) or not groups:
            raise ValueError("FSDP2 state dict: 'param_groups' must be a non-empty list")
        info = groups[0].get(INFO_KEY) if isinstance(groups[0], Mapping) else None
        plain = [{k: v for k, v in g.items() if not _is_dsopt_key(k)} if isinstance(g, Mapping)
                 else g for g in groups]
        entries = self._fsdp_entries(dict(state_dict, param_groups=plain))
        algorithm = self._facts.algorithm
        blob = reset = None
        # Each parameter's step where it counts its own: the entry's (a
        # torch.optim checkpoint loaded into this optimizer's state dict with
        # allow_partial_load leaves group 0's "dsopt" entry as it was, and
        # the steps are torch's).
        steps = {i: _step_of(e.get("step", 1), f"state[{i}]") for i, e in entries.items()} \
            if algorithm.param_steps else {}
        if info is None:  # torch.optim's own
            self._require_torch_format("load a torch.optim state dict")
        else:
            if not isinstance(info, Mapping) or info.get("format") != FORMAT or \
                    info.get("algorithm") != algorithm.type:
                raise ValueError(
                    f"FSDP2 state dict of {info.get('algorithm') if isinstance(info, Mapping) else info!r} "
                    f"(format {info.get('format') if isinstance(info, Mapping) else '?'}); this "
                    f"optimizer is {algorithm.type} (format {FORMAT})")
            sections = unpack_sections(info["common"])
            topology = self._shards.topology(self._comm)
            saved_local = groups[0].get(rank_local_key(topology)) \
                if list(info.get("topology", ())) == topology else None
            template = Blob(self.dsopt.state_dict())
            if saved_local is not None:
                sections.update(unpack_sections(self._shards.rank_local_bytes(saved_local)))
            else:  # none for this layout: empty, and reset by the load
                sections.update({n: b"" for n in template.sections if section_kind(n) == "rank_local"})
            reset = algorithm.compressed and saved_local is None
            blob = template.replaced(sections)  # Mismatch: nothing changed
        writes, from_params = self._fsdp_parts(entries)
        try:
            if blob is not None:
                self.dsopt.load_state_dict(blob, without_rank_local=bool(reset))
            with torch.no_grad():
                for target, part in writes:
                    if target.data_ptr() != part.data_ptr():
                        target.copy_(part)
                for i in from_params:
                    views, _ = self.state.views(i, strict=True)
                    views["master"]._local_tensor.copy_(self._tensors[i]._local_tensor)
                for i, step in steps.items():
                    self.dsopt.set_param_step(i, step)
                if info is None:
                    for i in range(len(self._tensors)):
                        if i not in steps:
                            self.dsopt.set_param_step(i, 0)
                        if i not in entries:
                            for name, view in self.state.views(i, strict=True)[0].items():
                                if name != "master":
                                    view._local_tensor.zero_()
        finally:
            self.state.invalidate()
        self._set_groups(plain)
        if reset:
            warnings.warn(
                f"dsopt.torch: {algorithm.type}'s rank-local state (compression errors) was "
                f"saved at another topology (replicas x shards {info.get('topology')}, here "
                f"{self._shards.topology(self._comm)}) and starts over from zero, as at a change "
                f"of world size; its moments and stage were resharded", RuntimeWarning,
                stacklevel=4)
