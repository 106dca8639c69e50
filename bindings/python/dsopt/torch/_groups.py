"""Parameter groups of dsopt.torch: the keys torch's Adam groups carry,
their validation (as torch validates, ValueError), and what of a group
goes to dsopt."""

import functools
import inspect
import math

import torch

# The types that count steps per parameter (torch.optim's bookkeeping),
# load torch.optim state dicts and carry state over a rebuild.
ADAM = ("Adam", "AdamW")

# The hyperparameters dsopt has per group (dsopt_set_group_param names).
# An algorithm without eps (Lion) has groups without it: its canonical
# optimizer.params has no "eps", and neither have its groups.
HYPER_KEYS = ("lr", "betas", "eps", "weight_decay")
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


def hyper_values(group, where=""):
    """(lr, beta1, beta2, eps, weight_decay) of a group, as floats,
    validated as torch.optim.Adam validates its arguments (ValueError),
    and finite; eps None for a group without it (an algorithm without
    eps)."""
    lr = _number(group["lr"], f"{where}lr")
    betas = group["betas"]
    try:
        beta1, beta2 = betas
    except (TypeError, ValueError):
        raise ValueError(f"{where}betas must be a pair (beta1, beta2), got {betas!r}") from None
    beta1 = _number(beta1, f"{where}betas[0]")
    beta2 = _number(beta2, f"{where}betas[1]")
    eps = _number(group["eps"], f"{where}eps") if "eps" in group else None
    weight_decay = _number(group["weight_decay"], f"{where}weight_decay")
    if not 0.0 <= lr < math.inf:
        raise ValueError(f"{where}Invalid learning rate: {lr}")
    if eps is not None and not 0.0 <= eps < math.inf:
        raise ValueError(f"{where}Invalid epsilon value: {eps}")
    if not 0.0 <= beta1 < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 0: {beta1}")
    if not 0.0 <= beta2 < 1.0:
        raise ValueError(f"{where}Invalid beta parameter at index 1: {beta2}")
    if not 0.0 <= weight_decay < math.inf:
        raise ValueError(f"{where}Invalid weight_decay value: {weight_decay}")
    return lr, beta1, beta2, eps, weight_decay


def dsopt_settings(group, *, all_keys, where=""):
    """The group's entry of dsopt's ``param_groups``: its hyperparameters
    as numbers (betas a list), ``non_freeze`` when set, and with
    ``all_keys`` every other key that is not torch's (dsopt rejects the
    ones it does not know, naming them)."""
    lr, beta1, beta2, eps, weight_decay = hyper_values(group, where)
    settings = {"lr": lr, "betas": [beta1, beta2], "eps": eps, "weight_decay": weight_decay}
    if eps is None:
        del settings["eps"]
    for key, value in group.items():
        if key == "params" or key in HYPER_KEYS or key in NOT_FOR_DSOPT:
            continue
        if key == "non_freeze" or all_keys:
            settings[key] = value
    return settings
