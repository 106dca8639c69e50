"""What an algorithm is, as the library's registry describes it
(``dsopt_algorithm_names``, ``dsopt_algorithm_describe``): the one source
the bindings build their behaviour from, instead of lists of names.

    >>> dsopt.algorithm_names()
    ('Lamb', 'Lion', 'Adam', 'AdamW', ...)
    >>> info = dsopt.describe("adamw")
    >>> info.type, info.moment_names, info.param_steps
    ('AdamW', ('exp_avg', 'exp_avg_sq'), True)
"""

import functools
from dataclasses import dataclass
from typing import NamedTuple

from ._lib import ffi, lib
from .errors import InvalidArgumentType, check

# dsopt_algorithm_info.hyper_ranges, by DSOPT_HYPER_* code.
BETA = "beta"                # in [0, 1)
NONNEGATIVE = "nonnegative"  # finite and >= 0
FLAG = "flag"                # 0 or 1: True or False in a config
_RANGES = {lib.DSOPT_HYPER_BETA: BETA, lib.DSOPT_HYPER_NONNEGATIVE: NONNEGATIVE,
           lib.DSOPT_HYPER_FLAG: FLAG}


class Hyperparameter(NamedTuple):
    """One group hyperparameter: ``name`` (``Optimizer.get_group_param``'s),
    ``key`` (its config key: a key shared by several names is a list of
    their values, as ``betas``), ``default`` (of ``optimizer.params``;
    a bool for a FLAG) and ``range`` (``BETA``, ``NONNEGATIVE`` or
    ``FLAG``)."""

    name: str
    key: str
    default: object
    range: str


@dataclass(frozen=True)
class Algorithm:
    """An algorithm as the registry describes it (``dsopt.describe``)."""

    type: str                 # its canonical "optimizer.type"
    aliases: tuple            # other accepted spellings (any case, as the type)
    moment_names: tuple       # its fp32 moments' state view names, in order
    hyperparameters: tuple    # Hyperparameter, lr first
    keys: tuple               # optimizer.params keys beyond the hyperparameters
    group_keys: tuple         # param_groups[i] keys beyond the hyperparameters
    flags: int                # DSOPT_ALGORITHM_*

    @property
    def moments(self) -> int:
        """fp32 moments per element of its state (m: 1; m and v: 2)."""
        return len(self.moment_names)

    @property
    def param_steps(self) -> bool:
        """Parameters count their own steps (as torch.optim's
        ``state["step"]``); each parameter's state stands alone, so a
        parameter group can be added after the first step."""
        return bool(self.flags & lib.DSOPT_ALGORITHM_PARAM_STEPS)

    @property
    def zero(self) -> bool:
        """Runs under ZeRO stage 1/2, compressed ZeRO included."""
        return bool(self.flags & lib.DSOPT_ALGORITHM_ZERO)

    @property
    def offload(self) -> bool:
        """Its ZeRO shard can live in host memory (``offload_optimizer``)."""
        return bool(self.flags & lib.DSOPT_ALGORITHM_OFFLOAD)

    @property
    def compressed(self) -> bool:
        """1-bit compressed communication after a warmup (error feedback,
        stages, momentum masks)."""
        return bool(self.flags & lib.DSOPT_ALGORITHM_COMPRESSED)

    @property
    def hyperparameter_keys(self) -> dict:
        """Each config key of the hyperparameters with the names it holds,
        in order: ``{"lr": ("lr",), "betas": ("beta1", "beta2"), ...}``."""
        keys = {}
        for h in self.hyperparameters:
            keys.setdefault(h.key, []).append(h.name)
        return {key: tuple(names) for key, names in keys.items()}


def _words(ptr) -> tuple:
    return tuple(ffi.string(ptr).decode("utf-8").split())


def algorithm_names() -> tuple:
    """The types of the algorithms this library has, in the registry's
    order (``dsopt_algorithm_names``)."""
    out = ffi.new("const char **")
    check(lib.dsopt_algorithm_names(out))
    return _words(out[0])


@functools.lru_cache(maxsize=None)
def _describe(optimizer_type: str) -> Algorithm:
    info = ffi.new("dsopt_algorithm_info *")
    info.struct_size = ffi.sizeof("dsopt_algorithm_info")
    check(lib.dsopt_algorithm_describe(optimizer_type.encode("utf-8"), info))
    names, keys = _words(info.hyper_names), _words(info.hyper_keys)
    hyper = []
    for i in range(info.num_hyper):
        kind = _RANGES[info.hyper_ranges[i]]
        default = float(info.hyper_defaults[i])
        hyper.append(Hyperparameter(names[i], keys[i], bool(default) if kind == FLAG else default,
                                    kind))
    return Algorithm(type=ffi.string(info.type).decode("utf-8"), aliases=_words(info.aliases),
                     moment_names=_words(info.moment_names), hyperparameters=tuple(hyper),
                     keys=_words(info.keys), group_keys=_words(info.group_keys),
                     flags=int(info.flags))


def describe(optimizer_type) -> Algorithm:
    """What the algorithm ``optimizer_type`` (a config's
    ``optimizer.type``, any case or alias) is (``dsopt_algorithm_describe``).
    Raises ``InvalidArgument`` for an unknown type."""
    if not isinstance(optimizer_type, str):
        raise InvalidArgumentType(f"optimizer_type must be a str, got {type(optimizer_type).__name__}")
    return _describe(optimizer_type)


__all__ = ["Algorithm", "BETA", "FLAG", "Hyperparameter", "NONNEGATIVE", "algorithm_names",
           "describe"]
