"""Rebuilding the dsopt optimizer under a dsopt.torch optimizer:
``add_param_group`` after creation, ``copy.deepcopy``, and parameters
whose storage, dtype or device changed (``follow_params``)."""

import copy

import torch

from ..communicator import Communicator
from ..errors import DsoptError, InvalidArgument
from ..optimizer import Optimizer as _DsoptOptimizer
from . import _device, _groups
from ._storage import ParamStorage, check_current, describe_param


def _copy_state(old, new, num_params, tensors, set_steps, old_dtypes):
    """Every state tensor and (Adam/AdamW) the step count of parameters
    ``0 .. num_params-1`` from dsopt optimizer ``old`` into ``new`` (the
    same parameters in the same order, each view covering the same part;
    ``old_dtypes`` their dtypes in ``old``). An fp32 master is copied
    where the parameter is 16-bit in both; ``new`` took the others from
    the parameters' current values."""
    from ._live_state import OPTIONAL_NAMES, no_view_error, view_tensor
    names = old.state_names()
    pairs = []  # every view before anything is copied
    for i in range(num_params):
        p = tensors[i]
        for name in names:
            if name == "master" and torch.float32 in (p.dtype, old_dtypes[i]):
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


def _has_state(opt):
    """Whether some parameter was updated (or a loaded state says so)."""
    return any(opt.dsopt.param_step(i) > 0 for i in range(len(opt._tensors)))


def _check_rebuild_allowed(opt):
    """Whether ``opt`` has state to carry over into a rebuilt optimizer
    (some parameter was updated); RuntimeError when it cannot be carried
    over (nothing has changed then)."""
    if not _has_state(opt):
        return False
    if opt._type not in _groups.ADAM:
        why = ("its compressed state and its stages span all parameters" if opt._type != "Lamb"
               else "dsopt.torch carries state over into a rebuilt optimizer for Adam and AdamW only")
        raise RuntimeError(
            f"dsopt.torch: {opt._type} cannot add a parameter group after its first step: {why}. "
            f"Add every group before the first step (or create the optimizer with all parameters "
            f"and keep some frozen).")
    if opt._zero_stage > 0 and opt.dsopt.communicator.size > 1:
        raise RuntimeError(
            "dsopt.torch: add_param_group under ZeRO stage 1/2 on several ranks works only "
            "before the first step: adding parameters moves every rank's shard, and the "
            "state of the old shards cannot be carried over without gathering it. Add "
            "every group before training, or save state_dict() on every rank and use "
            "load_state_dict_shards on an optimizer created with all groups.")
    return True


def add_param_group(opt, param_group, torch_add):
    """``opt.add_param_group`` after creation (see its doc)."""
    opt._follow_params()
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
        _rebuild(opt, carry="views" if stepped else None, new_group=count)
    except BaseException:
        del opt.param_groups[count:]
        raise


def _on_device(config, device):
    """``config`` for an optimizer on ``device`` (its ``"device"`` key)."""
    if config.get("device", "cpu") == device.type:
        return config
    return dict(config, device=device.type)


def _rebuild(opt, carry, new_group=None, device=None):
    """Creates dsopt's optimizer over every group's parameters (collective)
    and carries the old one's state over: ``carry`` "views" copies the old
    parameters' state tensors and step counts (``_copy_state``), "blob"
    the whole state through a state blob (the parameters' count, numels and
    dtypes unchanged), None nothing. Group ``new_group`` is new (its other
    keys go to dsopt, which rejects what it does not know). ``device``
    (a torch.device): where the parameters are now, when they moved.
    Before any update there is nothing to carry: the new optimizer's fp32
    masters are the parameters, as the old ones still were."""
    settings = [_groups.dsopt_settings(g, opt._hyper_params, all_keys=(i == new_group),
                                       where=f"param_groups[{i}]: ")
                for i, g in enumerate(opt.param_groups)]
    tensors = [p for group in opt.param_groups for p in group["params"]]
    group_of = [i for i, group in enumerate(opt.param_groups) for _ in group["params"]]
    config = opt._config if device is None else _on_device(opt._config, device)
    old = opt.dsopt
    with _device.current(device):
        _device.bind_comm(opt._comm, device)
        new = _DsoptOptimizer(dict(config, param_groups=settings), tensors, opt._comm,
                              groups=group_of)
        try:
            if carry == "blob":
                new.load_state_dict(old.state_dict())
            elif carry == "views":
                _copy_state(old, new, len(opt._tensors), tensors,
                            set_steps=opt._type in _groups.ADAM, old_dtypes=opt._storage.dtypes)
        except BaseException:
            new.close()
            raise
    opt.dsopt = new
    opt._config = config
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


def needs_rebuild(opt):
    """Whether following the parameters needs a new dsopt optimizer (a
    dtype, numel or the device changed), not only new storage."""
    storage = opt._storage
    return bool(storage.dtype_changes() or storage.numel_changes()) or \
        opt._tensors[0].device != storage.device


def _change_text(opt, dtype_changes, device):
    """What happened to the parameters, for error messages."""
    storage = opt._storage
    if not dtype_changes:
        return f"the parameters moved from {storage.device} to {device}"
    i = dtype_changes[0]
    more = f" (and {len(dtype_changes) - 1} more)" if len(dtype_changes) > 1 else ""
    text = f"{describe_param(opt, i)}{more} was cast from {storage.dtypes[i]} to " \
           f"{opt._tensors[i].dtype}"
    if device != storage.device:
        text += f" and moved from {storage.device} to {device}"
    return text


def _rebind(opt):
    """New storage of the same dtypes, numels and device: dsopt takes it
    (not collective) and nothing else changes."""
    tensors = opt._tensors
    try:
        opt.dsopt.rebind_params(tensors)
    except InvalidArgument as error:
        when = " Move or cast the model between steps, not between backward and step() " \
               "(overlap=True)." if opt._handed_over else ""
        raise RuntimeError(f"dsopt.torch: the parameters got new storage that dsopt cannot "
                           f"take: {error}.{when} Nothing was updated.") from None
    opt._storage = ParamStorage(tensors)
    opt._grad_descriptors.clear()  # a moved model's .grad got new storage too


def _check_rebuild_possible(opt, what, dtype_changes, numel_changes, collective):
    """Whether the rebuilt optimizer carries state over (some parameter was
    updated, or a loaded state says so); RuntimeError where the change
    cannot be followed now (nothing has changed then)."""
    if opt._handed_over:
        raise RuntimeError(
            f"dsopt.torch: {what} after gradients of this step were handed over to dsopt "
            f"(overlap=True); they cannot be carried over. Move or cast the model between "
            f"steps, not between backward and step(). Nothing was updated.")
    ranks = opt.dsopt.communicator.size
    if not collective and ranks > 1:
        raise RuntimeError(
            f"dsopt.torch: {what} since the last step. On {ranks} ranks the optimizer "
            f"follows a cast or a move to another device in the next step() (it rebuilds "
            f"dsopt's optimizer, a collective call); call this after that step. Nothing was "
            f"changed.")
    stepped = _has_state(opt)
    if stepped and numel_changes:
        i = numel_changes[0]
        raise RuntimeError(
            f"dsopt.torch: {describe_param(opt, i)} now has {opt._tensors[i].numel()} "
            f"elements, {opt._storage.numels[i]} when the optimizer took it: its state cannot "
            f"change size. Nothing was updated.")
    if stepped and dtype_changes and opt._type not in _groups.ADAM:
        raise RuntimeError(
            f"dsopt.torch: {what} after {opt._type}'s first step: its compressed state and "
            f"its stage span all parameters and cannot be carried into an optimizer over "
            f"other dtypes. Cast the model before creating the optimizer (or cast it back to "
            f"{opt._storage.dtypes[dtype_changes[0]]} to continue). Nothing was updated.")
    return stepped


def follow_params(opt, collective=True):
    """Points dsopt at the parameters as they are now, after some storage,
    dtype or device changed (``opt._storage.moved()``); see the
    dsopt.torch module doc. New storage of the same dtype and device:
    ``dsopt.rebind_params`` (not collective), and the run goes on bit for
    bit. Another dtype or device: a new dsopt optimizer (collective) with
    the state carried over: through a state blob when only the device
    changed (everything: steps, moments, masters, the 1-bit optimizers'
    compressed state, the loss scale), else the moments and step counts
    (Adam/AdamW), fp32 masters taken from the current values where a
    parameter became 16-bit; before any update there is nothing to carry.
    What cannot be followed raises RuntimeError before anything changes.
    ``collective`` False (other ranks need not make this call at the same
    time): a rebuild on several ranks raises instead."""
    storage = opt._storage
    device = check_current(opt)
    dtype_changes = storage.dtype_changes()
    numel_changes = storage.numel_changes()
    if not dtype_changes and not numel_changes and device == storage.device:
        _rebind(opt)
        return
    what = _change_text(opt, dtype_changes, device)
    stepped = _check_rebuild_possible(opt, what, dtype_changes, numel_changes, collective)
    carry = None if not stepped else "views" if dtype_changes else "blob"
    try:
        _rebuild(opt, carry=carry, device=device)
    except (DsoptError, RuntimeError, ValueError) as error:
        raise RuntimeError(f"dsopt.torch: {what}, and dsopt could not continue there: "
                           f"{error}. Nothing was updated.") from error


def pickled_state(opt):
    """What ``unpickle`` rebuilds ``opt`` from (``Optimizer.__reduce_ex__``)."""
    opt._follow_params(collective=False)  # the blob's dtypes are the parameters'
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
    opt._follow_params()  # the blob's dtypes are the parameters'
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
