"""torch.optim.Adam/AdamW state dicts in and out of dsopt.torch
(``load_state_dict`` of a torch state dict, ``torch_state_dict()``):
``TorchStateMixin`` is that part of ``dsopt.torch.Optimizer``'s own code."""

import copy
import math
from collections.abc import Mapping

import torch

from . import _groups
from ._live_state import _step_dtype

_MOMENTS = ("exp_avg", "exp_avg_sq")
_TEMPLATES = {}


def is_torch_state_dict(state_dict) -> bool:
    """A torch.optim state dict: ``state`` and ``param_groups``, no
    ``dsopt_state``."""
    return isinstance(state_dict, Mapping) and "dsopt_state" not in state_dict and \
        "state" in state_dict and "param_groups" in state_dict


def _template(torch_class):
    """The keys and default values of a group of ``torch_class`` in the
    running torch version."""
    template = _TEMPLATES.get(torch_class)
    if template is None:
        dummy = torch_class([torch.zeros(1, requires_grad=True)])
        template = {k: v for k, v in dummy.param_groups[0].items() if k != "params"}
        _TEMPLATES[torch_class] = template
    return template


def _step_of(value, what):
    try:
        step = float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{what}: 'step' must be a number, got {value!r}") from None
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        raise ValueError(f"{what}: 'step' must be a whole number >= 0, got {step}")
    return int(step)


class TorchStateMixin:
    """torch.optim's own state dict format for ``dsopt.torch.Optimizer``
    (which inherits this through ``StateDictMixin``): it works on the
    attributes ``Optimizer`` keeps (``dsopt``, ``state``, ``param_groups``,
    the algorithm's ``_type``, ``_decoupled`` and ``_zero_stage``, the
    parameters ``_tensors``) and calls ``_check_groups`` and
    ``_set_groups``."""

    def _require_adam(self, what):
        if self._type not in _groups.ADAM:
            raise ValueError(
                f"{type(self).__name__} ({self._type}) cannot {what}: only Adam and AdamW have "
                f"a torch.optim counterpart (a 1-bit optimizer's state has none); use "
                f"state_dict() / load_state_dict() with dsopt's own state dicts")

    def _torch_class(self):
        """The torch.optim class whose state dicts match this optimizer's
        (Adam/AdamW)."""
        if not self._decoupled:
            return torch.optim.Adam
        if self._type == "Adam" and "decoupled_weight_decay" in self.defaults:
            return torch.optim.Adam  # torch >= 2.6: Adam(decoupled_weight_decay=True)
        return torch.optim.AdamW

    def _export_torch_state(self):
        """``torch_state_dict()`` (see there)."""
        self._require_adam("export a torch.optim state dict")
        if self._zero_stage > 0 and self.dsopt.communicator.size > 1:
            raise ValueError(
                f"torch_state_dict() under ZeRO stage {self._zero_stage} on "
                f"{self.dsopt.communicator.size} ranks: every rank holds only its shard of the "
                f"moments, and torch.optim's state dict has whole tensors. Save state_dict() on "
                f"every rank, or load those with load_state_dict_shards into a one-process "
                f"optimizer and export from there.")
        torch_class = self._torch_class()
        template = _template(torch_class)
        param_groups, start = [], 0
        for group in self.param_groups:
            entry = dict(template)
            for key, value in group.items():
                if key == "params" or key == "non_freeze":
                    continue
                if key in _groups.NOT_FOR_DSOPT and key not in template and key != "param_names":
                    continue  # a flag this torch version's class does not have
                entry[key] = copy.deepcopy(value)
            if "decoupled_weight_decay" in template:
                entry["decoupled_weight_decay"] = self._decoupled
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            param_groups.append(entry)
        state = {}
        dsopt = self.dsopt
        for i, p in enumerate(self._tensors):
            step = dsopt.param_step(i)
            if step <= 0:
                continue
            tensors, _ = self.state.views(i, strict=True)
            state[i] = {"step": torch.tensor(float(step), dtype=_step_dtype())}
            for name in _MOMENTS:
                state[i][name] = tensors[name].reshape(p.shape).to(
                    device=p.device, dtype=p.dtype, copy=True)
        return {"state": state, "param_groups": param_groups}


    def _checked_torch_entries(self, state_dict):
        """{param index: (step, exp_avg, exp_avg_sq)} of a torch state dict,
        everything checked (ValueError)."""
        what = "torch state dict"
        saved_groups = state_dict["param_groups"]
        state = state_dict["state"]
        if not isinstance(state, Mapping):
            raise ValueError(f"{what}: 'state' must be a dict")
        self._check_groups({"param_groups": saved_groups}, what)
        ids = [k for g in saved_groups for k in g["params"]]
        id_map = {}
        for index, key in enumerate(ids):
            id_map.setdefault(key, index)
        entries = {}
        for key, entry in state.items():
            if key not in id_map:
                raise ValueError(f"{what}: 'state' has an entry for parameter {key!r}, which no "
                                 f"parameter group lists")
            i = id_map[key]
            p = self._tensors[i]
            where = f"{what}: state[{key!r}]"
            if not isinstance(entry, Mapping):
                raise ValueError(f"{where} must be a dict")
            if "max_exp_avg_sq" in entry:
                raise _groups.unsupported("amsgrad", f"{where}: 'max_exp_avg_sq': ")
            if not entry:
                continue  # torch's defaultdict leaves empty entries: no state
            missing = [k for k in ("step",) + _MOMENTS if k not in entry]
            if missing:
                raise ValueError(f"{where} lacks {missing} (an Adam/AdamW state has 'step', "
                                 f"'exp_avg' and 'exp_avg_sq')")
            moments = []
            for name in _MOMENTS:
                tensor = entry[name]
                if not isinstance(tensor, torch.Tensor):
                    raise ValueError(f"{where}[{name!r}] must be a tensor, got "
                                     f"{type(tensor).__name__}")
                if tensor.numel() != p.numel():
                    raise ValueError(f"{where}[{name!r}] has shape {tuple(tensor.shape)}; "
                                     f"parameter {i} has shape {tuple(p.shape)}")
                if tensor.is_complex() or not tensor.is_floating_point():
                    raise ValueError(f"{where}[{name!r}] must be a real floating-point tensor, "
                                     f"got {tensor.dtype}")
                moments.append(tensor)
            entries[i] = (_step_of(entry["step"], where), *moments)
        return entries


    def _load_torch_state(self, state_dict):
        """``load_state_dict`` of a torch.optim.Adam/AdamW state dict (see
        there): checked completely, then written into dsopt's state."""
        self._require_adam("load a torch.optim state dict")
        saved_groups = state_dict["param_groups"]
        if not isinstance(saved_groups, (list, tuple)):
            raise ValueError("torch state dict: 'param_groups' must be a list")
        # capturable / differentiable change nothing in the numbers: taken as False.
        saved_groups = [dict(g, capturable=False, differentiable=False)
                        if isinstance(g, Mapping) else g for g in saved_groups]
        entries = self._checked_torch_entries(dict(state_dict, param_groups=saved_groups))
        dsopt = self.dsopt
        # Every view before anything is written (ValueError: nothing changed).
        views = [self.state.views(i, strict=True) for i in range(len(self._tensors))]
        with torch.no_grad():
            for i, p in enumerate(self._tensors):
                tensors, offset = views[i]
                got = entries.get(i)
                for k, name in enumerate(_MOMENTS):
                    target = tensors[name]
                    if got is None:
                        target.zero_()
                    else:
                        target.copy_(_part(got[1 + k], offset, target))
                if "master" in tensors:  # the fp32 masters of 16-bit parameters: the parameters
                    tensors["master"].copy_(_part(p.detach(), offset, tensors["master"]))
                dsopt.set_param_step(i, 0 if got is None else got[0])
        self.state.invalidate()
        self._set_groups(saved_groups)


def _part(tensor, offset, target):
    """The part of ``tensor`` (a whole parameter's) that ``target`` holds,
    shaped like it (elements ``offset ..`` under ZeRO)."""
    flat = tensor.reshape(-1)
    if offset is not None:
        flat = flat[offset:offset + target.numel()]
    return flat.reshape(target.shape)
