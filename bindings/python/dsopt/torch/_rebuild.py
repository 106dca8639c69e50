"""Rebuilding the dsopt optimizer under a dsopt.torch optimizer:
``add_param_group`` after creation and ``copy.deepcopy``."""

import copy

import torch

from ..communicator import Communicator
from ..errors import InvalidArgument
from ..optimizer import Optimizer as _DsoptOptimizer
from . import _groups


def _copy_state(old, new, num_params, tensors, set_steps):
    """Every state tensor and (Adam/AdamW) the step count of parameters
    ``0 .. num_params-1`` from dsopt optimizer ``old`` into ``new`` (the
    same parameters in the same order, each view covering the same part)."""
    from ._live_state import OPTIONAL_NAMES, no_view_error, view_tensor
    names = old.state_names()
    pairs = []  # every view before anything is copied
    for i in range(num_params):
        p = tensors[i]
        for name in names:
            if name == "master" and p.dtype == torch.float32:
                continue
            try:
                source = old.state_view(i, name)
            except InvalidArgument as error:
                if name in OPTIONAL_NAMES:
                    continue  # a name this parameter lacks
                raise no_view_error(i, name, error) from None
            try:
                target = new.state_view(i, name)
            except InvalidArgument as error:
                raise no_view_error(i, name, error) from None
            if source.offset != target.offset or source.data.shape != target.data.shape:
                raise RuntimeError(f"dsopt.torch: parameter {i}'s {name!r} is laid out "
                                   f"differently in the rebuilt optimizer")
            pairs.append((p, source, target))
    for p, source, target in pairs:
        if source.data.shape[0] == 0:
            continue
        dst = view_tensor(target, p, shaped=False)
        dst.copy_(view_tensor(source, p, shaped=False))
    if set_steps:
        for i in range(num_params):
            new.set_param_step(i, old.param_step(i))


def _check_rebuild_allowed(opt):
    """Whether ``opt`` has state to carry over into a rebuilt optimizer
    (some parameter was updated); RuntimeError when it cannot be carried
    over (nothing has changed then)."""
    dsopt = opt.dsopt
    stepped = any(dsopt.param_step(i) > 0 for i in range(len(opt._tensors)))
    if not stepped:
        return False
    if opt._type not in _groups.ADAM:
        raise RuntimeError(
            f"dsopt.torch: {opt._type} cannot add a parameter group after its first step: its "
            f"compressed state and its stages span all parameters. Add every group before "
            f"the first step (or create the optimizer with all parameters and keep some "
            f"frozen).")
    if opt._zero_stage > 0 and dsopt.communicator.size > 1:
        raise RuntimeError(
            "dsopt.torch: add_param_group under ZeRO stage 1/2 on several ranks works only "
            "before the first step: adding parameters moves every rank's shard, and the "
            "state of the old shards cannot be carried over without gathering it. Add "
            "every group before training, or save state_dict() on every rank and use "
            "load_state_dict_shards on an optimizer created with all groups.")
    return True


def add_param_group(opt, param_group, torch_add):
    """``opt.add_param_group`` after creation (see its doc)."""
    stepped = _check_rebuild_allowed(opt)
    if opt._handed_over:
        raise RuntimeError("dsopt.torch: add_param_group while gradients are handed over "
                           "(overlap=True): call it between steps")
    opt._sync_hyperparameters()  # the old groups' current values are dsopt's
    count = len(opt.param_groups)
    torch_add(param_group)
    try:
        group = opt.param_groups[-1]
        _groups.check_flags(group, f"param_groups[{count}]: ", opt._decoupled)
        _rebuild(opt, new_group=count, carry_state=stepped)
    except BaseException:
        del opt.param_groups[count:]
        raise


def _rebuild(opt, new_group, carry_state):
    """Creates dsopt's optimizer over every group's parameters (collective)
    and carries the old parameters' state over; group ``new_group`` is new
    (its other keys go to dsopt, which rejects what it does not know).
    Before any update there is nothing to carry: the new optimizer's fp32
    masters are the parameters, as the old ones still were."""
    settings = [_groups.dsopt_settings(g, all_keys=(i == new_group), where=f"param_groups[{i}]: ")
                for i, g in enumerate(opt.param_groups)]
    tensors = [p for group in opt.param_groups for p in group["params"]]
    group_of = [i for i, group in enumerate(opt.param_groups) for _ in group["params"]]
    old = opt.dsopt
    new = _DsoptOptimizer(dict(opt._config, param_groups=settings), tensors, opt._comm,
                          groups=group_of)
    try:
        if carry_state:
            _copy_state(old, new, len(opt._tensors), tensors,
                        set_steps=opt._type in _groups.ADAM)
    except BaseException:
        new.close()
        raise
    opt.dsopt = new
    num_old = len(opt._tensors)
    opt._set_up(tensors)  # invalidates opt.state's views
    if old.communicator.kind == "local":
        # Destroyed when the last state view of it is gone (each keeps it
        # referenced; the garbage collector destroys one-process optimizers):
        # a view someone kept does not point into freed memory.
        del old
    else:
        old.close()  # collective: every rank rebuilds at once
    if opt.overlap and opt._hooked:
        opt._hook(range(num_old, len(tensors)))


def pickled_state(opt):
    """What ``unpickle`` rebuilds ``opt`` from (``Optimizer.__reduce_ex__``)."""
    return {"param_groups": opt.param_groups, "defaults": opt.defaults, "config": opt._config,
            "overlap": opt.overlap, "dsopt_state": opt.dsopt.state_dict(),
            "extras": dict(dict.items(opt.state)), "last_step_info": opt.last_step_info}


def unpickle(cls, state):
    """An optimizer of ``cls`` over the parameters of ``state``'s groups
    with its dsopt state, on a local communicator."""
    return _remake(cls, state["param_groups"], state["defaults"], state["config"],
                   state["overlap"], state["dsopt_state"], state["extras"],
                   state["last_step_info"])


def _remake(cls, groups, defaults, config, overlap, blob, extras, last_step_info, new=None):
    """``new`` (or a new ``cls``) made an optimizer over ``groups`` on a
    local communicator, with the dsopt state ``blob`` and ``extras`` as the
    other keys of its ``state``."""
    from ._optimizer import Optimizer
    if new is None:
        new = cls.__new__(cls)
    local = Communicator.local()
    try:
        Optimizer.__init__(new, [dict(g) for g in groups], config, local, overlap=overlap,
                           _defaults=defaults, _known_keys_only=True)
    except BaseException:
        local.close()
        raise
    new._owns_comm = True
    new.dsopt.load_state_dict(blob)
    new.state.invalidate()
    new.param_groups = groups
    new.defaults = defaults
    new._hyper = [new._dsopt_hyper(i) for i in range(len(groups))]
    new._seen = [None] * len(groups)
    new._sync_hyperparameters()
    new.last_step_info = last_step_info
    for key, value in extras.items():
        dict.__setitem__(new.state, key, value)
    return new


def deepcopy_optimizer(opt, memo):
    """``copy.deepcopy(opt)`` (see ``Optimizer.__deepcopy__``)."""
    if opt.dsopt.communicator.size > 1:
        raise RuntimeError(
            "copy.deepcopy of a dsopt.torch optimizer on several ranks: creating an optimizer "
            "is collective over its communicator. Create the copy on every rank with the "
            "constructor and load_state_dict(opt.state_dict()).")
    cls = type(opt)
    new = cls.__new__(cls)
    memo[id(opt)] = new
    groups = copy.deepcopy(opt.param_groups, memo)
    extras = {}
    for key, value in dict.items(opt.state):
        new_key = memo.get(id(key), key) if isinstance(key, torch.Tensor) else key
        extras[new_key] = copy.deepcopy(value, memo)
    _remake(cls, groups, copy.deepcopy(opt.defaults, memo), opt._config, opt.overlap,
            opt.dsopt.state_dict(), extras, opt.last_step_info, new=new)
    # What else the optimizer holds (torch's hook dicts, attributes of the
    # subclass or of the user).
    for key, value in opt.__dict__.items():
        if key not in new.__dict__ or (key.startswith("_optimizer_") and key.endswith("_hooks")):
            new.__dict__[key] = copy.deepcopy(value, memo)
    return new
