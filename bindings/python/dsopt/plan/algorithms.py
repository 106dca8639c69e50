"""What the library says each algorithm is (dsopt_algorithm_names,
dsopt_algorithm_describe), and the planner's reading of it: which gradient
paths an algorithm runs on, how much state it keeps per element, and which
cost model its compressed communication follows. The planner holds no list
of algorithms: a type the library registers is plannable from its
description.

The description comes from the binding's ``dsopt.describe``; the
planner keeps the part of it that its cost models read."""

from dataclasses import dataclass
from functools import lru_cache

# dsopt_algorithm_info.flags (include/dsopt.h "What an algorithm is").
PARAM_STEPS, ZERO, OFFLOAD, COMPRESSED = 1, 2, 4, 8

# The algorithm every speedup is measured against, and whose uncompressed
# ZeRO rows keep their short names ("ZeRO-1", "ZeRO-2 int8/int8").
BASELINE = "AdamW"

# How a type is written in the table: the 1-bit family's prefixes and
# LAMB's acronym ("OneBitLamb" -> "1-bit LAMB").
_SPELLING = (("OneBit", "1-bit "), ("ZeroOne", "0/1 "), ("Lamb", "LAMB"))


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm, as dsopt_algorithm_describe gives it."""
    type: str
    flags: int
    moments: int             # fp32 arrays per element of its state
    moment_names: tuple
    keys: tuple              # optimizer.params keys beyond the hyperparameters
    hyper_names: tuple

    @property
    def zero(self) -> bool:
        """Runs under ZeRO-1/2 and compressed ZeRO."""
        return bool(self.flags & ZERO)

    @property
    def compressed(self) -> bool:
        """The 1-bit family: its own compressed allreduce after a warmup."""
        return bool(self.flags & COMPRESSED)

    @property
    def trust_ratio(self) -> bool:
        """LAMB's layer-wise trust ratio (its coefficient bounds among the
        keys): the update u is held in a buffer of its own to take its
        per-tensor norm, and the 1-bit version compresses one fused buffer."""
        return "max_coeff" in self.keys

    @property
    def schedule(self) -> str:
        """The compressed family's schedule: "freeze" (warmup steps until
        freeze_step, then compressed ones: 1-bit Adam/LAMB), "zero_one"
        (0/1 Adam's variance and local-step schedules), None for the
        uncompressed algorithms."""
        if not self.compressed:
            return None
        if "var_freeze_step" in self.keys:
            return "zero_one"
        if "freeze_step" in self.keys:
            return "freeze"
        raise ValueError(f"the planner has no cost model for the compressed algorithm {self.type!r} "
                         "(its keys name neither freeze_step nor var_freeze_step)")

    @property
    def cost_prefix(self) -> str:
        """The profile's cost names of the compressed family's work."""
        if self.schedule == "zero_one":
            return "zoadam"
        return "onebit_lamb" if self.trust_ratio else "onebit_adam"

    @property
    def label(self) -> str:
        text = self.type
        for word, spelled in _SPELLING:
            text = text.replace(word, spelled)
        return text


@lru_cache(maxsize=None)
def _names() -> tuple:
    from ..algorithms import algorithm_names

    return algorithm_names()


@lru_cache(maxsize=None)
def _describe(name: str) -> Algorithm:
    from .. import algorithms
    from ..errors import DsoptError

    try:
        a = algorithms.describe(name)
    except DsoptError:
        raise ValueError(f"unknown algorithm {name!r}; the library has: " + ", ".join(_names())) from None
    return Algorithm(a.type, a.flags, a.moments, a.moment_names, a.keys,
                     tuple(h.name for h in a.hyperparameters))


def names() -> tuple:
    """Every registered type, in the library's order (the moment rules first)."""
    return _names()


def describe(name: str) -> Algorithm:
    """The algorithm `name` (its type or an alias, any case)."""
    return _describe(name)


def same_but_name(alg: Algorithm) -> tuple:
    """The description but for the type: two types alike in it (Adam and
    AdamW: the same moments, keys and hyperparameters) give the same rows."""
    return (alg.flags, alg.moments, alg.moment_names, alg.keys, alg.hyper_names)
