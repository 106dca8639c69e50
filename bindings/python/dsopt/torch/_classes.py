"""The torch-style classes of dsopt.torch, one per algorithm of the
library: ``Adam`` and ``AdamW`` with torch.optim's signatures and defaults,
and the others with torch-style hyperparameters plus their own settings as
keyword arguments, written here where they carry documentation or settings
of their own; every other algorithm of the registry gets a class made from
its description at import time (``_generated``). Each builds a dsopt
config and is a ``dsopt.torch.Optimizer``."""

import inspect
import math

import torch

from ..algorithms import algorithm_names, describe
from . import _generated, _groups
from ._optimizer import Optimizer

_DSOPT_SETTINGS_DOC = """
    Keyword-only, for every class: ``comm`` (None: torch.distributed's
    default group when initialised, else one process; a
    ``dsopt.Communicator``, an mpi4py communicator or a ProcessGroup),
    ``overlap`` (hand gradients over during backward, torch >= 2.1), and
    dsopt's settings (None: dsopt's default): ``gradient_clipping``
    (global norm; 0 = off), ``fp16`` (True, or a dict of the config's
    ``"fp16"`` section: ``loss_scale``, ``initial_scale_power``,
    ``loss_scale_window``, ``hysteresis``, ``consecutive_hysteresis``,
    ``min_loss_scale``; turns on loss scaling: multiply the loss by
    ``opt.loss_scale``), ``bf16`` (True: informational), ``skip_nonfinite``
    (default True), ``max_consecutive_skips`` (default 50; 0 = never
    raise), ``gradient_accumulation_steps`` (with ``overlap``),
    ``zero_optimization`` (a dict of the config's section) or
    ``zero_stage`` (0, 1 or 2; Adam/AdamW), ``device`` ("cpu" or "cuda";
    default: where the parameters are), ``threads`` (CPU kernel threads;
    0 = OpenMP's default) and ``divergence_check`` (False turns the check of
    a gradient norm far above its history off; a dict is the config's
    section: ``factor``, ``min_steps``, ``horizon``, ``count``,
    ``window``). An unknown keyword is a TypeError, a bad value a
    ValueError naming it.
"""


# ---- argument checks -----------------------------------------------------------

def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name, value, low):
    if not _is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def _check_number(name, value, low=None, positive=False):
    if not _is_number(value) or not math.isfinite(value) or \
            (low is not None and value < low) or (positive and value <= 0):
        bound = " > 0" if positive else f" >= {low}" if low is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _tensors_of(groups):
    tensors = []
    for group in groups:
        params = group["params"] if isinstance(group, dict) else [group]
        for p in ([params] if isinstance(params, torch.Tensor) else params):
            tensors.append(p[1] if isinstance(p, tuple) and len(p) == 2 else p)
    return tensors


def _materialize(params):
    """(the parameter groups as a list, with each group's params a list;
    every tensor) — torch's __init__ would consume iterators, and the
    device is read from the tensors first."""
    if isinstance(params, torch.Tensor):
        raise TypeError("params argument given to the optimizer should be an iterable of "
                        "Tensors or dicts, but got " + torch.typename(params))
    groups = list(params)
    if not groups:
        raise ValueError("optimizer got an empty parameter list")
    if isinstance(groups[0], dict):
        groups = [dict(g, params=list(g["params"]) if not isinstance(g["params"], torch.Tensor)
                       else [g["params"]]) if isinstance(g, dict) and "params" in g else g
                  for g in groups]
        return groups, _tensors_of(groups)
    return groups, _tensors_of([{"params": groups}])


def _device(device, tensors):
    """"cpu" or "cuda": the argument, else where the parameters are."""
    kinds = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
    if device is None:
        if len(kinds) > 1:
            raise ValueError(f"the parameters are on several kinds of device ({sorted(kinds)}); "
                             f"dsopt keeps one optimizer on one")
        kind = kinds.pop() if kinds else "cpu"
    else:
        try:
            kind = device.type if isinstance(device, torch.device) else \
                torch.device(device).type if isinstance(device, str) else None
        except RuntimeError:
            kind = None
        if kind is None:
            raise ValueError(f"device must be 'cpu', 'cuda' or a torch.device, got {device!r}")
        if kinds and kinds != {kind}:
            raise ValueError(f"device={device!r}, but the parameters are on {sorted(kinds)}")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda' (dsopt's devices), got {kind!r}")
    return kind


def _settings_config(tensors, algorithm, *, gradient_clipping, fp16, bf16, skip_nonfinite,
                     max_consecutive_skips, gradient_accumulation_steps, zero_optimization,
                     zero_stage, device, threads, divergence_check=None):
    """The top-level config keys of dsopt's settings."""
    config = {}
    kind = _device(device, tensors)
    if kind != "cpu":
        config["device"] = kind
    if gradient_clipping is not None:
        config["gradient_clipping"] = _check_number("gradient_clipping", gradient_clipping, 0)
    if fp16 is not None and fp16 is not False:
        if fp16 is True:
            config["fp16"] = {"enabled": True}
        elif isinstance(fp16, dict):
            config["fp16"] = dict({"enabled": True}, **fp16)
        else:
            raise ValueError(f"fp16 must be True, False or a dict of the config's fp16 section "
                             f"(loss_scale, initial_scale_power, ...), got {fp16!r}")
    if bf16 is not None and bf16 is not False:
        _check_bool("bf16", bf16)
        if config.get("fp16", {}).get("enabled"):
            raise ValueError("fp16 and bf16 cannot both be enabled")
        config["bf16"] = {"enabled": True}
    if skip_nonfinite is not None:
        config["skip_nonfinite"] = _check_bool("skip_nonfinite", skip_nonfinite)
    if max_consecutive_skips is not None:
        config["max_consecutive_skips"] = _check_int("max_consecutive_skips",
                                                     max_consecutive_skips, 0)
    if gradient_accumulation_steps is not None:
        config["gradient_accumulation_steps"] = _check_int(
            "gradient_accumulation_steps", gradient_accumulation_steps, 1)
    if threads is not None:
        config["threads"] = _check_int("threads", threads, 0)
    if divergence_check is not None:
        if isinstance(divergence_check, bool):
            config["divergence_check"] = {"enabled": divergence_check}
        elif isinstance(divergence_check, dict):
            config["divergence_check"] = dict(divergence_check)
        else:
            raise ValueError(f"divergence_check must be True, False or a dict of the config's "
                             f"section (factor, min_steps, ...), got {divergence_check!r}")
    zero = None
    if zero_optimization is not None:
        if not isinstance(zero_optimization, dict):
            raise ValueError(f"zero_optimization must be a dict (the config's section, e.g. "
                             f"{{'stage': 2}}), got {zero_optimization!r}")
        zero = dict(zero_optimization)
    if zero_stage is not None:
        if not _is_int(zero_stage) or zero_stage not in (0, 1, 2):
            raise ValueError(f"zero_stage must be 0, 1 or 2, got {zero_stage!r}")
        if zero is not None and zero.get("stage", zero_stage) != zero_stage:
            raise ValueError(f"zero_stage={zero_stage} contradicts zero_optimization's stage "
                             f"{zero['stage']!r}")
        zero = dict(zero or {}, stage=zero_stage)
    if zero is not None:
        stage = zero.get("stage", 0)
        if not algorithm.zero and stage not in (0, None):
            sharded = [name for name in algorithm_names() if describe(name).zero]
            raise ValueError(f"zero_stage / zero_optimization stage {stage!r}: ZeRO stage 1/2 "
                             f"exist for {', '.join(sharded)} ({algorithm.type} runs with "
                             f"stage 0)")
        config["zero_optimization"] = zero
    return config


def _torch_default(cls, name, fallback):
    """The default of ``name`` in ``cls.__init__`` of the running torch."""
    param = inspect.signature(cls.__init__).parameters.get(name)
    return fallback if param is None else param.default


# torch 1.13's Adam has fused=False, torch 2.x's fused=None.
_ADAM_FUSED = _torch_default(torch.optim.Adam, "fused", None)
_ADAMW_FUSED = _torch_default(torch.optim.AdamW, "fused", None)


def _torch_flags(amsgrad=False, maximize=False, capturable=False, differentiable=False):
    for name, value in (("amsgrad", amsgrad), ("maximize", maximize),
                        ("capturable", capturable), ("differentiable", differentiable)):
        if value:
            raise _groups.unsupported(name)


class _TorchStyle(Optimizer):
    """What the torch-style classes share: the config from the arguments."""

    _CONFIG_TYPE = None
    # torch's flags the groups carry, with their defaults (None: every one
    # of _groups.TORCH_FLAGS)
    _GROUP_FLAGS = None

    def _build(self, params, hyper, algorithm, group_defaults, comm, overlap, settings):
        """``hyper``: the hyperparameters by config key (``lr``,
        ``betas``, ...: the algorithm's, as its description lists them);
        ``algorithm``: its other ``optimizer.params``; ``group_defaults``:
        torch's flags as given."""
        groups, tensors = _materialize(params)
        spec = _groups.hyper(self._CONFIG_TYPE)
        params = spec.by_key(spec.values(hyper), as_list=True)
        config = {"optimizer": {"type": self._CONFIG_TYPE, "params": dict(params, **algorithm)}}
        config.update(_settings_config(tensors, describe(self._CONFIG_TYPE), **settings))
        defaults = {key: tuple(value) if len(spec.keys[key]) > 1 else value
                    for key, value in hyper.items()}
        defaults.update(_groups.TORCH_FLAGS if self._GROUP_FLAGS is None else self._GROUP_FLAGS)
        defaults.update(group_defaults)
        super().__init__(groups, config, comm, overlap=overlap, _defaults=defaults)


def _adam_hyper(lr, betas, eps, weight_decay):
    return {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}


def _settings(gradient_clipping, fp16, bf16, skip_nonfinite, max_consecutive_skips,
              gradient_accumulation_steps, zero_optimization, zero_stage, device, threads,
              divergence_check=None):
    return dict(gradient_clipping=gradient_clipping, fp16=fp16, bf16=bf16,
                skip_nonfinite=skip_nonfinite, max_consecutive_skips=max_consecutive_skips,
                gradient_accumulation_steps=gradient_accumulation_steps,
                zero_optimization=zero_optimization, zero_stage=zero_stage, device=device,
                threads=threads, divergence_check=divergence_check)


class Adam(_TorchStyle):
    """``torch.optim.Adam`` on dsopt: L2 weight decay (added to the
    gradient), as torch's Adam; dsopt config ``{"type": "Adam",
    "adam_w_mode": false}``.

    ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False, *, foreach=None, maximize=False, capturable=False,
    differentiable=False, fused=None, decoupled_weight_decay=False, ...)``
    (``fused``'s default is the running torch's: False in torch 1.13)

    ``amsgrad``, ``maximize``, ``capturable`` and ``differentiable`` must
    stay False (ValueError otherwise); ``foreach`` and ``fused`` are
    accepted and kept in the groups, and change nothing: dsopt always runs
    one fused step. ``decoupled_weight_decay=True`` (torch >= 2.6's
    argument) decouples the decay, as AdamW.
    """

    _CONFIG_TYPE = "Adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=_ADAM_FUSED, decoupled_weight_decay=False, comm=None,
                 overlap=False, gradient_clipping=None, fp16=None, bf16=None,
                 skip_nonfinite=None, max_consecutive_skips=None,
                 gradient_accumulation_steps=None, zero_optimization=None, zero_stage=None,
                 device=None, threads=None, divergence_check=None):
        _torch_flags(amsgrad, maximize, capturable, differentiable)
        decoupled = _check_bool("decoupled_weight_decay", decoupled_weight_decay)
        group_defaults = {"foreach": foreach, "fused": fused}
        if _groups.torch_adam_has_decoupled_weight_decay():
            group_defaults["decoupled_weight_decay"] = decoupled
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), {"adam_w_mode": decoupled},
                    group_defaults, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


class AdamW(_TorchStyle):
    """``torch.optim.AdamW`` on dsopt: decoupled weight decay; dsopt config
    ``{"type": "AdamW"}``.

    ``AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=1e-2, amsgrad=False, *, maximize=False, foreach=None,
    capturable=False, differentiable=False, fused=None, ...)``

    ``amsgrad``, ``maximize``, ``capturable`` and ``differentiable`` must
    stay False (ValueError otherwise); ``foreach`` and ``fused`` are
    accepted and kept in the groups, and change nothing: dsopt always runs
    one fused step.
    """

    _CONFIG_TYPE = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=_ADAMW_FUSED, comm=None, overlap=False,
                 gradient_clipping=None, fp16=None, bf16=None, skip_nonfinite=None,
                 max_consecutive_skips=None, gradient_accumulation_steps=None,
                 zero_optimization=None, zero_stage=None, device=None, threads=None, divergence_check=None):
        _torch_flags(amsgrad, maximize, capturable, differentiable)
        group_defaults = {"foreach": foreach, "fused": fused}
        if _groups.torch_adam_has_decoupled_weight_decay():
            group_defaults["decoupled_weight_decay"] = True
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), {}, group_defaults, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


def _stabilize(stabilize, stabilize_limit):
    return {"stabilize": _check_bool("stabilize", stabilize),
            "stabilize_limit": _check_number("stabilize_limit", stabilize_limit, positive=True)}


class OneBitAdam(_TorchStyle):
    """1-bit Adam (dsopt ``"OneBitAdam"``; docs/optimizers/onebit-adam.md "1-bit Adam") with
    torch-style hyperparameters; weight decay is decoupled, both moments are
    bias-corrected as AdamW's (``bias_correction=False`` with
    ``stabilize=False``: DeepSpeed's rule).

    ``OneBitAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0, *, freeze_step=100000, bias_correction=True,
    stabilize=True, stabilize_limit=4.0, ...)``: updates ``1 .. freeze_step-1`` are warmup
    (plain averaged gradients), later ones communicate the momentum
    compressed to 1 bit. Groups may set ``non_freeze=True`` (warmup math for
    the whole run). A parameter without ``.grad`` steps with a zero
    gradient (every parameter takes part in every step).
    """

    _CONFIG_TYPE = "OneBitAdam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
                 freeze_step=100000, bias_correction=True, stabilize=True, stabilize_limit=4.0, comm=None,
                 overlap=False, gradient_clipping=None, fp16=None, bf16=None,
                 skip_nonfinite=None, max_consecutive_skips=None,
                 gradient_accumulation_steps=None, zero_optimization=None, zero_stage=None,
                 device=None, threads=None, divergence_check=None):
        algorithm = {"freeze_step": _check_int("freeze_step", freeze_step, 1),
                     "bias_correction": _check_bool("bias_correction", bias_correction)}
        algorithm.update(_stabilize(stabilize, stabilize_limit))
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), algorithm, {}, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


class OneBitLamb(_TorchStyle):
    """1-bit LAMB (dsopt ``"OneBitLamb"``; docs/optimizers/onebit-lamb.md "1-bit LAMB") with
    torch-style hyperparameters; weight decay is decoupled, no bias
    correction.

    ``OneBitLamb(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0, *, freeze_step=100000, max_coeff=10.0, min_coeff=0.01,
    coeff_beta=0.9, factor_max=4.0, factor_min=0.5, factor_threshold=0.1,
    stabilize=True, stabilize_limit=4.0, ...)``. A parameter without
    ``.grad`` steps with a zero gradient.
    """

    _CONFIG_TYPE = "OneBitLamb"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
                 freeze_step=100000, max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9,
                 factor_max=4.0, factor_min=0.5, factor_threshold=0.1, stabilize=True,
                 stabilize_limit=4.0, comm=None, overlap=False, gradient_clipping=None,
                 fp16=None, bf16=None, skip_nonfinite=None, max_consecutive_skips=None,
                 gradient_accumulation_steps=None, zero_optimization=None, zero_stage=None,
                 device=None, threads=None, divergence_check=None):
        algorithm = {"freeze_step": _check_int("freeze_step", freeze_step, 1),
                     "max_coeff": _check_number("max_coeff", max_coeff, positive=True),
                     "min_coeff": _check_number("min_coeff", min_coeff, positive=True),
                     "coeff_beta": _check_number("coeff_beta", coeff_beta, 0),
                     "factor_max": _check_number("factor_max", factor_max, positive=True),
                     "factor_min": _check_number("factor_min", factor_min, positive=True),
                     "factor_threshold": _check_number("factor_threshold", factor_threshold, 0)}
        algorithm.update(_stabilize(stabilize, stabilize_limit))
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), algorithm, {}, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


class Lamb(_TorchStyle):
    """LAMB (dsopt ``"Lamb"``; docs/optimizers/lamb.md) with torch-style
    hyperparameters: Adam's moments, weight decay added to the update, and
    each tensor's step scaled by its trust ratio ||p|| / ||update||,
    clamped to [min_coeff, max_coeff]; both moments bias-corrected unless
    ``bias_correction=False`` (then 1-bit LAMB's warmup rule, bit for bit).
    Its state can be sharded with ZeRO stage 1/2 (``zero_stage=2``).

    ``Lamb(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
    bias_correction=True, max_coeff=10.0, min_coeff=0.01, ...)``. A
    parameter without ``.grad`` steps with a zero gradient.
    """

    _CONFIG_TYPE = "Lamb"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
                 bias_correction=True, max_coeff=10.0, min_coeff=0.01, comm=None, overlap=False,
                 gradient_clipping=None, fp16=None, bf16=None, skip_nonfinite=None,
                 max_consecutive_skips=None, gradient_accumulation_steps=None,
                 zero_optimization=None, zero_stage=None, device=None, threads=None,
                 divergence_check=None):
        algorithm = {"bias_correction": _check_bool("bias_correction", bias_correction),
                     "max_coeff": _check_number("max_coeff", max_coeff, positive=True),
                     "min_coeff": _check_number("min_coeff", min_coeff, positive=True)}
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), algorithm, {}, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


class ZeroOneAdam(_TorchStyle):
    """0/1 Adam (dsopt ``"ZeroOneAdam"``; docs/optimizers/zero-one-adam.md "0/1 Adam") with
    torch-style hyperparameters; weight decay is decoupled, both moments are
    bias-corrected (``bias_correction=False`` with ``stabilize=False``:
    DeepSpeed's rule).

    ``ZeroOneAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
    weight_decay=0, *, var_freeze_step=100000, bias_correction=True, var_update_scaler=16,
    local_step_scaler=32678, local_step_clipper=16,
    decoupled_sync_weight_decay=False, stabilize=True, stabilize_limit=4.0,
    ...)``. A parameter without ``.grad`` steps with a zero gradient.
    """

    _CONFIG_TYPE = "ZeroOneAdam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, *,
                 var_freeze_step=100000, bias_correction=True, var_update_scaler=16, local_step_scaler=32678,
                 local_step_clipper=16, decoupled_sync_weight_decay=False, stabilize=True,
                 stabilize_limit=4.0, comm=None, overlap=False, gradient_clipping=None,
                 fp16=None, bf16=None, skip_nonfinite=None, max_consecutive_skips=None,
                 gradient_accumulation_steps=None, zero_optimization=None, zero_stage=None,
                 device=None, threads=None, divergence_check=None):
        algorithm = {
            "var_freeze_step": _check_int("var_freeze_step", var_freeze_step, 0),
            "bias_correction": _check_bool("bias_correction", bias_correction),
            "var_update_scaler": _check_int("var_update_scaler", var_update_scaler, 1),
            "local_step_scaler": _check_int("local_step_scaler", local_step_scaler, 1),
            "local_step_clipper": _check_int("local_step_clipper", local_step_clipper, 1),
            "decoupled_sync_weight_decay": _check_bool("decoupled_sync_weight_decay",
                                                       decoupled_sync_weight_decay)}
        algorithm.update(_stabilize(stabilize, stabilize_limit))
        self._build(params, _adam_hyper(lr, betas, eps, weight_decay), algorithm, {}, comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


class Lion(_TorchStyle):
    """Lion (dsopt ``"Lion"``; docs/optimizers/lion.md) with torch-style
    hyperparameters: every element steps by ``lr`` in the direction of
    ``sign(beta1 * m + (1 - beta1) * g)``, with decoupled weight decay, and
    one moment ``m`` (``exp_avg``). Its state can be sharded with ZeRO
    stage 1/2 (``zero_stage=2``). Its groups carry ``lr``, ``betas`` and
    ``weight_decay`` (no ``eps``).

    ``Lion(params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, ...)``,
    the defaults of the paper's reference code. A parameter without
    ``.grad`` is left alone.
    """

    _CONFIG_TYPE = "Lion"

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, comm=None,
                 overlap=False, gradient_clipping=None, fp16=None, bf16=None, skip_nonfinite=None,
                 max_consecutive_skips=None, gradient_accumulation_steps=None,
                 zero_optimization=None, zero_stage=None, device=None, threads=None,
                 divergence_check=None):
        self._build(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay}, {}, {},
                    comm, overlap,
                    _settings(gradient_clipping, fp16, bf16, skip_nonfinite,
                              max_consecutive_skips, gradient_accumulation_steps,
                              zero_optimization, zero_stage, device, threads,
                              divergence_check))


_WRITTEN = (Adam, AdamW, Lamb, OneBitAdam, OneBitLamb, ZeroOneAdam, Lion)
for _cls in _WRITTEN:
    _cls.__doc__ += _DSOPT_SETTINGS_DOC

# Every algorithm of the registry without a class above gets one made from
# its description, named after its type (``dsopt.torch.SGD``).
_CLASSES = {describe(cls._CONFIG_TYPE).type: cls for cls in _WRITTEN}
for _name in algorithm_names():
    if _name not in _CLASSES:
        _CLASSES[_name] = _generated.torch_style_class(describe(_name), _TorchStyle, _settings,
                                                       _DSOPT_SETTINGS_DOC)
        globals()[_CLASSES[_name].__name__] = _CLASSES[_name]

# dsopt.torch exports exactly these (its __init__ imports them all): one
# class per algorithm, in the registry's order.
__all__ = [_CLASSES[name].__name__ for name in algorithm_names()]
