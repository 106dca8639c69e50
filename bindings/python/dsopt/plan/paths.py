"""Gradient paths modelled outside the generic models: bytes.py,
collectives.py, memory.py and timing.py hand a configuration of such a
path to the module registered for it (FSDP2 and HSDP: fsdp.py, which
registers itself when dsopt.plan is imported), without importing it: that
module builds on theirs."""

_MODELS = {}


def register(paths, model) -> None:
    """`model` (a module with step_pairs, calls, memory, step_time) models
    the configurations of `paths`."""
    for path in paths:
        _MODELS[path] = model


def model_of(config):
    """The module registered for config.path."""
    try:
        return _MODELS[config.path]
    except KeyError:
        raise ValueError(f"no model of the gradient path {config.path!r} is registered "
                         "(import dsopt.plan, which registers them)") from None
