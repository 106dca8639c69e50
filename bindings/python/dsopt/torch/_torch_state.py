"""torch.optim state dicts in and out of dsopt.torch (``load_state_dict``
of a torch state dict, ``torch_state_dict()``), for the algorithms whose
parameters count their own steps (``dsopt.describe(type).param_steps``):
each parameter's state is its moments by their names (the description's
``moment_names``, torch's state keys) and, where torch's class of the
same name keeps one, its ``"step"``. ``TorchStateMixin`` is that part of
``dsopt.torch.Optimizer``'s own code."""

import copy
import inspect
import math
from collections.abc import Mapping

import torch

from . import _groups
from ._core import OptimizerCore
from ._live_state import _step_dtype

_TEMPLATES = {}
_KEEPS_STEP = {}


def is_torch_state_dict(state_dict) -> bool:
    """A torch.optim state dict: ``state`` and ``param_groups``, no
    ``dsopt_state``."""
    return isinstance(state_dict, Mapping) and "dsopt_state" not in state_dict and \
        "state" in state_dict and "param_groups" in state_dict


def _template(torch_class):
    """The keys and default values of a group of ``torch_class`` in the
    running torch version ({} for None: no torch class). ``lr`` is given
    (torch 1.13's SGD requires it); the groups' own values replace it."""
    if torch_class is None:
        return {}
    template = _TEMPLATES.get(torch_class)
    if template is None:
        dummy = torch_class([torch.zeros(1, requires_grad=True)], lr=1e-3)
        template = {k: v for k, v in dummy.param_groups[0].items() if k != "params"}
        _TEMPLATES[torch_class] = template
    return template


def _keeps_step(torch_class) -> bool:
    """Whether ``torch_class`` keeps ``state["step"]`` (torch.optim.Adam
    does, SGD does not), as one step of it shows; True without a torch
    class (dsopt's parameters count their steps)."""
    if torch_class is None:
        return True
    keeps = _KEEPS_STEP.get(torch_class)
    if keeps is None:
        p = torch.zeros(1, requires_grad=True)
        dummy = torch_class([p], lr=1e-3)
        p.grad = torch.zeros(1)
        dummy.step()
        keeps = _KEEPS_STEP[torch_class] = "step" in dummy.state[p]
    return keeps


def _step_of(value, what):
    try:
        step = float(value.item() if isinstance(value, torch.Tensor) else value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"{what}: 'step' must be a number, got {value!r}") from None
    if not (math.isfinite(step) and step >= 0 and step == int(step)):
        raise ValueError(f"{what}: 'step' must be a whole number >= 0, got {step}")
    return int(step)


class TorchStateMixin(OptimizerCore):
    """torch.optim's own state dict format for ``dsopt.torch.Optimizer``
    (which inherits this through ``StateDictMixin``): it uses what
    ``OptimizerCore`` declares, and ``StateDictMixin``'s ``_check_groups``
    and ``_set_groups``."""

    def _require_torch_format(self, what):
        algorithm = self._facts.algorithm
        if not algorithm.param_steps:
            raise ValueError(
                f"{type(self).__name__} ({algorithm.type}) cannot {what}: its parameters do not "
                f"count their own steps (its state spans all parameters), so torch.optim has no "
                f"format for it; use state_dict() / load_state_dict() with dsopt's own state "
                f"dicts")

    def _torch_class(self):
        """The torch.optim class whose state dicts match this optimizer's:
        the one of the algorithm's name (None: torch has none). Where the
        weight-decay mode is a setting (torch's Adam family), L2 decay is
        torch.optim.Adam's and decoupled decay AdamW's, or the class's own
        when its groups carry ``decoupled_weight_decay`` (torch >= 2.6)."""
        facts = self._facts
        torch_class = getattr(torch.optim, facts.type, None)
        if torch_class is None or facts.decoupled is None:
            return torch_class
        if not facts.decoupled:
            return torch.optim.Adam
        if "decoupled_weight_decay" in self.defaults and "decoupled_weight_decay" in \
                inspect.signature(torch_class.__init__).parameters:
            return torch_class  # torch >= 2.6: Adam(decoupled_weight_decay=True)
        return torch.optim.AdamW

    def _export_torch_state(self):
        """``torch_state_dict()`` (see there)."""
        self._require_torch_format("export a torch.optim state dict")
        zero_stage = self._facts.zero_stage
        if zero_stage > 0 and self.dsopt.communicator.size > 1:
            raise ValueError(
                f"torch_state_dict() under ZeRO stage {zero_stage} on "
                f"{self.dsopt.communicator.size} ranks: every rank holds only its shard of the "
                f"moments, and torch.optim's state dict has whole tensors. Save state_dict() on "
                f"every rank, or load those with load_state_dict_shards into a one-process "
                f"optimizer and export from there.")
        torch_class = self._torch_class()
        template = _template(torch_class)
        algorithm = self._facts.algorithm
        param_groups, start = [], 0
        for group in self.param_groups:
            entry = dict(template)
            for key, value in group.items():
                if key == "params" or key in algorithm.group_keys:
                    continue
                if key in _groups.NOT_FOR_DSOPT and key not in template and key != "param_names":
                    continue  # a flag this torch version's class does not have
                entry[key] = copy.deepcopy(value)
            if "decoupled_weight_decay" in template:
                entry["decoupled_weight_decay"] = self._facts.decoupled
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            param_groups.append(entry)
        state = {}
        dsopt = self.dsopt
        keeps_step = _keeps_step(torch_class)
        for i, p in enumerate(self._tensors):
            step = dsopt.param_step(i)
            if step <= 0:
                continue
            tensors, _ = self.state.views(i, strict=True)
            state[i] = {"step": torch.tensor(float(step), dtype=_step_dtype())} if keeps_step else {}
            for name in algorithm.moment_names:
                state[i][name] = tensors[name].reshape(p.shape).to(
                    device=p.device, dtype=p.dtype, copy=True)
        return {"state": state, "param_groups": param_groups}


    def _checked_torch_entries(self, state_dict):
        """{param index: (step, *moments)} of a torch state dict (the
        moments in the order of the algorithm's ``moment_names``; the step
        1 where torch's class keeps none), everything checked
        (ValueError)."""
        what = "torch state dict"
        moment_names = self._facts.algorithm.moment_names
        keeps_step = _keeps_step(self._torch_class())
        required = (("step",) if keeps_step else ()) + moment_names
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
            if not entry or all(entry.get(name) is None for name in moment_names):
                # torch's defaultdict leaves empty entries, torch 1.13's SGD
                # without momentum a None buffer: no state
                continue
            missing = [k for k in required if k not in entry]
            if missing:
                raise ValueError(f"{where} lacks {missing} (a {self._facts.type} state has "
                                 f"{', '.join(map(repr, required))})")
            moments = []
            for name in moment_names:
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
            step = _step_of(entry["step"], where) if keeps_step else 1
            entries[i] = (step, *moments)
        return entries


    def _load_torch_state(self, state_dict):
        """``load_state_dict`` of a torch.optim state dict (see there):
        checked completely, then written into dsopt's state."""
        self._require_torch_format("load a torch.optim state dict")
        saved_groups = state_dict["param_groups"]
        if not isinstance(saved_groups, (list, tuple)):
            raise ValueError("torch state dict: 'param_groups' must be a list")
        # capturable / differentiable change nothing in the numbers: taken as False.
        saved_groups = [dict(g, **{k: False for k in ("capturable", "differentiable") if k in g})
                        if isinstance(g, Mapping) else g for g in saved_groups]
        entries = self._checked_torch_entries(dict(state_dict, param_groups=saved_groups))
        dsopt = self.dsopt
        # Every view before anything is written (ValueError: nothing changed).
        views = [self.state.views(i, strict=True) for i in range(len(self._tensors))]
        with torch.no_grad():
            for i, p in enumerate(self._tensors):
                tensors, offset = views[i]
                got = entries.get(i)
                for k, name in enumerate(self._facts.algorithm.moment_names):
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
