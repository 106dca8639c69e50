"""Parameter groups of dsopt.torch: the keys torch's groups carry, their
validation (as torch validates, ValueError), and what of a group goes to
dsopt. What an algorithm's groups hold comes from its description
(``dsopt.describe``)."""

import functools
import inspect
import math

import torch

from ..algorithms import BETA, FLAG, NONNEGATIVE, describe

# torch.optim.Adam's flags: accepted in groups so torch code reading them
# works; the ones dsopt cannot honour must stay False.
TORCH_FLAGS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
               "differentiable": False, "fused": None}
UNSUPPORTED_FLAGS = {
    "amsgrad": "AMSGrad (amsgrad=True)",
    "maximize": "maximize=True (negate the loss instead)",
    "capturable": "capturable=True (CUDA graph capture of step())",
    "differentiable": "differentiable=True (autograd through step())",
}
# Keys of torch's groups that never go to dsopt.
NOT_FOR_DSOPT = set(TORCH_FLAGS) | {"param_names", "decoupled_weight_decay"}


@functools.lru_cache(maxsize=None)
def torch_adam_has_decoupled_weight_decay() -> bool:
    """torch >= 2.6: ``torch.optim.Adam(..., decoupled_weight_decay=)``, in
    every Adam/AdamW group."""
    return "decoupled_weight_decay" in inspect.signature(torch.optim.Adam.__init__).parameters


def unsupported(name, where="") -> ValueError:
    return ValueError(f"{where}{name}=True: dsopt does not support "
                      f"{UNSUPPORTED_FLAGS[name]}")


def check_flags(group, where="", decoupled=None):
    """ValueError for a torch flag dsopt cannot honour, and for a
    ``decoupled_weight_decay`` (torch >= 2.6's Adam groups) other than
    ``decoupled``, the optimizer's weight-decay mode (None: not checked)."""
    for name in UNSUPPORTED_FLAGS:
        if group.get(name):
            raise unsupported(name, where)
    value = group.get("decoupled_weight_decay")
    if decoupled is not None and value is not None and bool(value) != decoupled:
        raise ValueError(
            f"{where}decoupled_weight_decay={value!r} differs from the optimizer's "
            f"({decoupled}): dsopt has one weight-decay mode per optimizer (AdamW, or "
            f"Adam(decoupled_weight_decay=True), for decoupled weight decay)")


def _number(value, what):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must be a number or a 1-element tensor")
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}") from None
    return value


# torch.optim's checks of a hyperparameter, by its range: the values
# accepted, and torch's message for value v at index i of config key
# ``key`` ("Invalid momentum value: -1", "Invalid beta parameter at index
# 1: 1.0"); torch words two keys its own way.
_TORCH_WORDS = {"lr": "learning rate", "eps": "epsilon value"}
_TORCH_CHECKS = {
    NONNEGATIVE: (lambda v: 0.0 <= v < math.inf,
                  lambda key, v, i: f"Invalid {_TORCH_WORDS.get(key, key + ' value')}: {v}"),
    BETA: (lambda v: 0.0 <= v < 1.0,
           lambda key, v, i: f"Invalid beta parameter at index {i}: {v}"),
    FLAG: (lambda v: v in (0.0, 1.0), lambda key, v, i: f"{key} must be True or False, got {v}"),
}


class Hyper:
    """An algorithm's group hyperparameters as its description lists them
    (``dsopt.describe``): ``names``, dsopt_get/set_group_param's, in
    order, ``keys``, each config key (a torch group's key) with the names
    it holds: one (a number, or a bool for a flag) or several (a tuple, as
    ``betas``), and ``flags``, the keys that are True or False."""

    def __init__(self, optimizer_type):
        info = describe(optimizer_type)
        self.names = tuple(h.name for h in info.hyperparameters)
        self.keys = info.hyperparameter_keys
        self.flags = frozenset(h.key for h in info.hyperparameters if h.range == FLAG)
        self._ranges = {h.key: h.range for h in info.hyperparameters}

    def values(self, group, where=""):
        """The group's hyperparameters as floats, in the order of
        ``names``, validated as torch.optim validates its arguments
        (ValueError, by each one's range); dsopt checks the rest when it
        gets them."""
        by_key = {}
        for key, names in self.keys.items():
            value = group[key]
            if len(names) == 1:
                by_key[key] = (_number(value, f"{where}{key}"),)
                continue
            try:
                items = tuple(value)
            except TypeError:
                items = ()
            if isinstance(value, (str, bytes)) or len(items) != len(names):
                kind = "a pair" if len(names) == 2 else f"a sequence of {len(names)}"
                raise ValueError(f"{where}{key} must be {kind} ({', '.join(names)}), "
                                 f"got {value!r}")
            by_key[key] = tuple(_number(v, f"{where}{key}[{i}]") for i, v in enumerate(items))
        for key, values in by_key.items():
            ok, message = _TORCH_CHECKS[self._ranges[key]]
            for i, v in enumerate(values):
                if not ok(v):
                    raise ValueError(f"{where}{message(key, v, i)}")
        out = {}
        for key, names in self.keys.items():
            out.update(zip(names, by_key[key]))
        return tuple(out[name] for name in self.names)

    def by_key(self, values, as_list=False):
        """``values`` (in the order of ``names``) by config key: a number
        (a bool for a flag), or a tuple (``as_list``: a list, as dsopt's
        config has it)."""
        of = dict(zip(self.names, values))
        out = {}
        for key, names in self.keys.items():
            items = [bool(of[name]) if key in self.flags else of[name] for name in names]
            out[key] = items[0] if len(names) == 1 else (items if as_list else tuple(items))
        return out


@functools.lru_cache(maxsize=None)
def hyper(optimizer_type) -> Hyper:
    """The group hyperparameters of ``optimizer_type`` (canonical type)."""
    return Hyper(optimizer_type)


def dsopt_settings(group, hyper, *, all_keys, where=""):
    """The group's entry of dsopt's ``param_groups``: its hyperparameters
    (``hyper``, the algorithm's) as numbers (a list for a key of several),
    ``non_freeze`` when set, and with ``all_keys`` every other key that is
    not torch's (dsopt rejects the ones it does not know, naming them)."""
    settings = hyper.by_key(hyper.values(group, where), as_list=True)
    for key, value in group.items():
        if key == "params" or key in hyper.keys or key in NOT_FOR_DSOPT:
            continue
        if key == "non_freeze" or all_keys:
            settings[key] = value
    return settings
