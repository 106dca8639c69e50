"""The torch-style class of an algorithm that has no hand-written one,
made from its description (``dsopt.describe``) when dsopt.torch is
imported, so that an algorithm added to the library's registry is in
dsopt.torch with no change here.

Its signature: ``params``, then each hyperparameter's config key with its
described default (a key of several hyperparameters as a tuple, as
``betas``; a flag as a bool), then torch's flags as torch.optim's class of
the same name takes them (``maximize``, ``foreach``, ``differentiable``,
``fused``, ... with torch's defaults and kinds; without such a class
``maximize``, ``foreach``, ``differentiable`` and ``fused``, keyword-only),
then dsopt's settings, keyword-only. Where torch.optim has the class, its
own constructor checks the hyperparameters first, so that a bad value is
torch's ValueError with torch's message."""

import inspect

import torch

from ..algorithms import FLAG
from . import _groups

# torch's flags of a class that torch.optim does not have.
_FLAGS_WITHOUT_COUNTERPART = ("maximize", "foreach", "differentiable", "fused")
_DSOPT_KEYWORDS = ("comm", "overlap")


def torch_counterpart(algorithm):
    """torch.optim's class of the algorithm's name, or None."""
    found = getattr(torch.optim, algorithm.type, None)
    return found if isinstance(found, type) and issubclass(found, torch.optim.Optimizer) else None


def _hyper_defaults(algorithm) -> dict:
    """Each hyperparameter config key with its described default."""
    defaults = {}
    for key, names in algorithm.hyperparameter_keys.items():
        values = [h.default for h in algorithm.hyperparameters if h.key == key]
        defaults[key] = tuple(values) if len(names) > 1 else values[0]
    return defaults


def _torch_flags(torch_class):
    """(the flags as parameters, positional ones first; their defaults)."""
    P = inspect.Parameter
    if torch_class is None:
        flags = [P(name, P.KEYWORD_ONLY, default=_groups.TORCH_FLAGS[name])
                 for name in _FLAGS_WITHOUT_COUNTERPART]
    else:
        theirs = inspect.signature(torch_class.__init__).parameters
        flags = [P(name, P.KEYWORD_ONLY if p.kind == P.KEYWORD_ONLY else P.POSITIONAL_OR_KEYWORD,
                   default=p.default)
                 for name, p in theirs.items() if name in _groups.TORCH_FLAGS]
        flags.sort(key=lambda p: p.kind)
    return flags, {p.name: p.default for p in flags}


def _check_as_torch(torch_class, hyper):
    """torch's own ValueError for a bad hyperparameter (its constructor
    over a stand-in parameter); what torch cannot judge is left to
    dsopt.torch's checks."""
    accepted = inspect.signature(torch_class.__init__).parameters
    try:
        torch_class([torch.zeros(1, requires_grad=True)],
                    **{k: v for k, v in hyper.items() if k in accepted})
    except (TypeError, RuntimeError):
        pass


def torch_style_class(algorithm, base, settings, settings_doc):
    """The class ``algorithm.type`` on ``base`` (``_TorchStyle``):
    ``settings`` is the function that collects dsopt's settings (its
    parameters are the keyword-only settings), ``settings_doc`` their
    documentation."""
    P = inspect.Parameter
    torch_class = torch_counterpart(algorithm)
    hyper_defaults = _hyper_defaults(algorithm)
    flags, flag_defaults = _torch_flags(torch_class)
    setting_names = tuple(inspect.signature(settings).parameters)
    params = [P("self", P.POSITIONAL_OR_KEYWORD), P("params", P.POSITIONAL_OR_KEYWORD)]
    params += [P(key, P.POSITIONAL_OR_KEYWORD, default=value)
               for key, value in hyper_defaults.items()]
    params += flags
    params += [P("comm", P.KEYWORD_ONLY, default=None), P("overlap", P.KEYWORD_ONLY, default=False)]
    params += [P(name, P.KEYWORD_ONLY, default=None) for name in setting_names]
    signature = inspect.Signature(params)

    def __init__(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs)  # TypeError as a written signature's
        arguments.apply_defaults()
        given = arguments.arguments
        for name in _groups.UNSUPPORTED_FLAGS:
            if given.get(name):
                raise _groups.unsupported(name)
        hyper = {key: given[key] for key in hyper_defaults}
        if torch_class is not None:
            _check_as_torch(torch_class, hyper)
        self._build(given["params"], hyper, {}, {name: given[name] for name in flag_defaults},
                    given["comm"], given["overlap"],
                    settings(**{name: given[name] for name in setting_names}))

    __init__.__signature__ = signature
    shown = str(inspect.Signature(params[1:]))
    flag_keys = [h.key for h in algorithm.hyperparameters if h.range == FLAG]
    counterpart = (f"a drop-in for ``torch.optim.{algorithm.type}`` (same signature, defaults, "
                   f"groups and ValueErrors; its state dicts load both ways)" if torch_class else
                   "torch.optim has no such class")
    doc = (f"{algorithm.type} (dsopt ``\"{algorithm.type}\"``) with torch-style arguments, made "
           f"from the algorithm's description (``dsopt.describe({algorithm.type!r})``): "
           f"{counterpart}.\n\n    ``{algorithm.type}{shown}``\n\n    "
           f"Its groups carry {', '.join(f'``{k}``' for k in hyper_defaults)}"
           f"{' (True or False: ' + ', '.join(flag_keys) + ')' if flag_keys else ''} and "
           f"torch's flags; ``opt.state[p]`` has its moments "
           f"{', '.join(f'``{m!r}``' for m in algorithm.moment_names)}. ``maximize``, "
           f"``capturable`` and ``differentiable`` must stay False (ValueError otherwise); "
           f"``foreach`` and ``fused`` are kept in the groups and change nothing.\n"
           + settings_doc)
    return type(algorithm.type, (base,), {
        "__init__": __init__, "__doc__": doc, "__module__": "dsopt.torch",
        "_CONFIG_TYPE": algorithm.type, "_GROUP_FLAGS": flag_defaults})
