"""Rebuilding the dsopt optimizer under a dsopt.torch optimizer:
``add_param_group`` after creation, ``copy.deepcopy``, pickling, and
parameters whose storage, dtype or device changed (``_follow_params``).
``RebuildMixin`` is that part of ``dsopt.torch.Optimizer``'s own code."""

import copy

import torch

from ..communicator import Communicator
from ..errors import DsoptError, InvalidArgument
from ..optimizer import Optimizer as _DsoptOptimizer
from . import _device, _groups
from ._core import OptimizerCore
from ._dtensor import refuse_rebuild
from ._live_state import OPTIONAL_NAMES, no_view_error, view_tensor
from ._storage import ParamStorage, check_current, describe_param


def _copy_state(old, new, num_params, tensors, set_steps, old_dtypes):
    """Every state tensor and (``set_steps``) the step count of parameters
    ``0 .. num_params-1`` from dsopt optimizer ``old`` into ``new`` (the
    same parameters in the same order, each view covering the same part;
    ``old_dtypes`` their dtypes in ``old``). An fp32 master is copied
    where the parameter is 16-bit in both; ``new`` took the others from
    the parameters' current values."""
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


def _spans_all_parameters(algorithm):
    """Why the state of ``algorithm`` (whose parameters do not count their
    own steps) cannot be carried over parameter by parameter."""
    if algorithm.compressed:
        return "its compressed state and its stages span all parameters"
    return "its parameters do not count their own steps (its state spans all parameters)"


def _on_device(config, device):
    """``config`` for an optimizer on ``device`` (its ``"device"`` key)."""
    if config.get("device", "cpu") == device.type:
        return config
    return dict(config, device=device.type)


class RebuildMixin(OptimizerCore):
    """The methods of ``dsopt.torch.Optimizer`` that make its dsopt
    optimizer again (``Optimizer`` inherits them): over new parameter
    groups, over parameters that moved or were cast, and for copies and
    unpickling. They use what ``OptimizerCore`` declares, nothing else."""

    # ---- parameter groups -----------------------------------------------------

    def add_param_group(self, param_group):
        """Adds a group (torch's ``add_param_group``). After creation this
        rebuilds dsopt's optimizer over all parameters (collective: every
        rank adds the same group), carrying over the old parameters'
        moments, fp32 masters and step counts and every group's
        hyperparameters exactly; the new parameters start fresh. Not
        carried: dsopt's global step count (``last_step_info.step``
        restarts from 0), the fp16 loss scale (it restarts at
        2^initial_scale_power: dsopt has no setter for it), momentum masks
        (set them again) and gradients handed over but not yet stepped
        (call it between steps). An algorithm whose parameters do not
        count their own steps (``dsopt.describe(type).param_steps`` False:
        Lamb, the 1-bit optimizers) takes new groups only before its first
        step (its state and stages span all parameters); ZeRO stage 1/2 on
        several ranks only while no parameter has state (the shards
        move)."""
        if not hasattr(self, "dsopt"):  # torch's __init__ adding the first groups
            super().add_param_group(param_group)
            return
        if self._shards is not None:
            raise refuse_rebuild("add_param_group after creation")
        self._follow_params()
        stepped = self._check_rebuild_allowed()
        if self._handed_over:
            raise RuntimeError("dsopt.torch: add_param_group while gradients are handed over "
                               "(overlap=True): call it between steps")
        self._sync_hyperparameters()  # the old groups' current values are dsopt's
        count = len(self.param_groups)
        super().add_param_group(param_group)
        try:
            group = self.param_groups[-1]
            _groups.check_flags(group, f"param_groups[{count}]: ", self._facts.decoupled)
            self._rebuild(carry="views" if stepped else None, new_group=count)
        except BaseException:
            del self.param_groups[count:]
            raise

    def _has_state(self):
        """Whether some parameter was updated (or a loaded state says so)."""
        return any(self.dsopt.param_step(i) > 0 for i in range(len(self._tensors)))

    def _check_rebuild_allowed(self):
        """Whether there is state to carry over into a rebuilt optimizer
        (some parameter was updated); RuntimeError when it cannot be carried
        over (nothing has changed then)."""
        if not self._has_state():
            return False
        facts = self._facts
        if not facts.algorithm.param_steps:
            raise RuntimeError(
                f"dsopt.torch: {facts.type} cannot add a parameter group after its first step: "
                f"{_spans_all_parameters(facts.algorithm)}. Add every group before the first "
                f"step (or create the optimizer with all parameters and keep some frozen).")
        if facts.zero_stage > 0 and self.dsopt.communicator.size > 1:
            raise RuntimeError(
                "dsopt.torch: add_param_group under ZeRO stage 1/2 on several ranks works only "
                "before the first step: adding parameters moves every rank's shard, and the "
                "state of the old shards cannot be carried over without gathering it. Add "
                "every group before training, or save state_dict() on every rank and use "
                "load_state_dict_shards on an optimizer created with all groups.")
        return True

    def _rebuild(self, carry, new_group=None, device=None):
        """Creates dsopt's optimizer over every group's parameters
        (collective) and carries the old one's state over: ``carry``
        "views" copies the old parameters' state tensors and step counts
        (``_copy_state``), "blob" the whole state through a state blob (the
        parameters' count, numels and dtypes unchanged), None nothing.
        Group ``new_group`` is new (its other keys go to dsopt, which
        rejects what it does not know). ``device`` (a torch.device): where
        the parameters are now, when they moved. Before any update there is
        nothing to carry: the new optimizer's fp32 masters are the
        parameters, as the old ones still were."""
        settings = [_groups.dsopt_settings(g, self._facts.hyper, all_keys=(i == new_group),
                                           where=f"param_groups[{i}]: ")
                    for i, g in enumerate(self.param_groups)]
        tensors = [p for group in self.param_groups for p in group["params"]]
        group_of = [i for i, group in enumerate(self.param_groups) for _ in group["params"]]
        config = self._config if device is None else _on_device(self._config, device)
        old = self.dsopt
        with _device.current(device):
            _device.bind_comm(self._comm, device)
            new = _DsoptOptimizer(dict(config, param_groups=settings), tensors, self._comm,
                                  groups=group_of)
            try:
                if carry == "blob":
                    new.load_state_dict(old.state_dict())
                elif carry == "views":
                    _copy_state(old, new, len(self._tensors), tensors,
                                set_steps=self._facts.algorithm.param_steps,
                                old_dtypes=self._storage.dtypes)
            except BaseException:
                new.close()
                raise
        self.dsopt = new
        self._config = config
        num_old = len(self._tensors)
        self._set_up(tensors)  # invalidates self.state's views
        if old.communicator.kind == "local":
            # Destroyed when the last state view of it is gone (each keeps it
            # referenced; the garbage collector destroys one-process
            # optimizers): a view someone kept does not point into freed memory.
            del old
        else:
            old.close()  # collective: every rank rebuilds at once
        if self.overlap and self._hooked:
            self._hook(range(num_old, len(tensors)))

    # ---- parameters that moved -----------------------------------------------

    def _follow_params(self, collective=True):
        """Points dsopt at the parameters' current storage when some
        parameter's storage, dtype or device changed since dsopt took it
        (``model.to(...)``, ``p.data = ...``): before every step and before
        anything else that has dsopt read or write them (see the module
        doc and ``_follow_moved_params``; ``collective`` False where
        other ranks need not call at the same time)."""
        if self._storage.moved():
            self._follow_moved_params(collective)

    def _needs_rebuild(self):
        """Whether following the parameters needs a new dsopt optimizer (a
        dtype, numel or the device changed), not only new storage."""
        storage = self._storage
        return bool(storage.dtype_changes() or storage.numel_changes()) or \
            self._tensors[0].device != storage.device

    def _describe_param(self, i):
        """Parameter ``i``'s place, for error messages."""
        return describe_param(self._tensors[i], i, self.param_groups)

    def _change_text(self, dtype_changes, numel_changes, device):
        """What happened to the parameters, for error messages: a cast, else
        a change of size, else a move (with the move added to the others)."""
        storage = self._storage
        changes = dtype_changes or numel_changes
        if not changes:
            return f"the parameters moved from {storage.device} to {device}"
        i = changes[0]
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        if dtype_changes:
            text = f"{self._describe_param(i)}{more} was cast from {storage.dtypes[i]} to " \
                   f"{self._tensors[i].dtype}"
        else:
            text = f"{self._describe_param(i)}{more} changed size from {storage.numels[i]} " \
                   f"to {self._tensors[i].numel()} elements"
        if device != storage.device:
            text += f" and moved from {storage.device} to {device}"
        return text

    def _rebind(self):
        """New storage of the same dtypes, numels and device: dsopt takes it
        (not collective) and nothing else changes."""
        tensors = self._tensors
        try:
            self.dsopt.rebind_params(self._dsopt_params())
        except InvalidArgument as error:
            when = " Move or cast the model between steps, not between backward and step() " \
                   "(overlap=True)." if self._handed_over else ""
            raise RuntimeError(f"dsopt.torch: the parameters got new storage that dsopt cannot "
                               f"take: {error}.{when} Nothing was updated.") from None
        self._storage = ParamStorage(tensors, None if self._shards is None else self._shards.locals)
        self._grad_descriptors.clear()  # a moved model's .grad got new storage too

    def _check_rebuild_possible(self, what, dtype_changes, numel_changes, collective):
        """Whether the rebuilt optimizer carries state over (some parameter
        was updated, or a loaded state says so); RuntimeError where the
        change cannot be followed now (nothing has changed then)."""
        if self._handed_over:
            raise RuntimeError(
                f"dsopt.torch: {what} after gradients of this step were handed over to dsopt "
                f"(overlap=True); they cannot be carried over. Move or cast the model between "
                f"steps, not between backward and step(). Nothing was updated.")
        ranks = self.dsopt.communicator.size
        if not collective and ranks > 1:
            raise RuntimeError(
                f"dsopt.torch: {what} since the last step. On {ranks} ranks the optimizer "
                f"follows a cast in the next step() (it rebuilds dsopt's optimizer, a "
                f"collective call); call this after that step. Nothing was changed.")
        stepped = self._has_state()
        if stepped and numel_changes:
            i = numel_changes[0]
            raise RuntimeError(
                f"dsopt.torch: {self._describe_param(i)} now has {self._tensors[i].numel()} "
                f"elements, {self._storage.numels[i]} when the optimizer took it: its state "
                f"cannot change size. Nothing was updated.")
        algorithm = self._facts.algorithm
        if stepped and dtype_changes and not algorithm.param_steps:
            raise RuntimeError(
                f"dsopt.torch: {what} after {algorithm.type}'s first step: "
                f"{_spans_all_parameters(algorithm)}, and cannot be carried into an optimizer "
                f"over other dtypes. Cast the model before creating the optimizer (or cast it "
                f"back to {self._storage.dtypes[dtype_changes[0]]} to continue). Nothing was "
                f"updated.")
        return stepped

    def _follow_moved_params(self, collective=True):
        """Points dsopt at the parameters as they are now, after some
        storage, dtype or device changed (``self._storage.moved()``); see
        the dsopt.torch module doc. New storage of the same dtype and
        device: ``dsopt.rebind_params`` (not collective), and the run goes
        on bit for bit. Another dtype or device: a new dsopt optimizer
        (collective) with the state carried over: through a state blob when
        only the device changed (everything: steps, moments, masters, the
        1-bit optimizers' compressed state, the loss scale), else the
        moments and step counts (an algorithm whose parameters count their
        own steps), fp32 masters taken from the
        current values where a parameter became 16-bit; before any update
        there is nothing to carry. What cannot be followed raises
        RuntimeError before anything changes. ``collective`` False (other
        ranks need not make this call at the same time): on several ranks
        a move to another device alone is left to the next collective
        call, and a cast raises."""
        storage = self._storage
        device = check_current(self._dsopt_params(), self.param_groups)
        dtype_changes = storage.dtype_changes()
        numel_changes = storage.numel_changes()
        if not dtype_changes and not numel_changes and device == storage.device:
            self._rebind()
            return
        if self._shards is not None:
            raise refuse_rebuild("casting, resizing or moving the model to another device "
                                 "after the optimizer was created")
        if not collective and not dtype_changes and not numel_changes and \
                not self._handed_over and self.dsopt.communicator.size > 1:
            # Moved to another device only: the blob and the state's copies
            # are the same bytes on either device, so a state dict taken
            # now (as accelerate's prepare() does right after the Trainer
            # moved the model) comes from the optimizer as it is; the
            # collective rebuild waits for the next step().
            return
        what = self._change_text(dtype_changes, numel_changes, device)
        stepped = self._check_rebuild_possible(what, dtype_changes, numel_changes, collective)
        carry = None if not stepped else "views" if dtype_changes else "blob"
        try:
            self._rebuild(carry=carry, device=device)
        except (DsoptError, RuntimeError, ValueError) as error:
            raise RuntimeError(f"dsopt.torch: {what}, and dsopt could not continue there: "
                               f"{error}. Nothing was updated.") from error

    # ---- copies and pickling ----------------------------------------------------

    def __deepcopy__(self, memo):
        """``copy.deepcopy(opt)``: a new optimizer of the same kind over
        deep copies of the parameters (through ``memo``, so that copying a
        model and its optimizer together keeps them connected) with the
        same state, on a communicator of its own (one process: an
        optimizer on several ranks raises, since creating one is
        collective)."""
        if self._shards is not None:
            raise refuse_rebuild("copy.deepcopy")
        if self.dsopt.communicator.size > 1:
            raise RuntimeError(
                "copy.deepcopy of a dsopt.torch optimizer on several ranks: creating an "
                "optimizer is collective over its communicator. Create the copy on every rank "
                "with the constructor and load_state_dict(opt.state_dict()).")
        self._follow_params()  # the blob's dtypes are the parameters'
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        groups = copy.deepcopy(self.param_groups, memo)
        extras = {}
        for key, value in dict.items(self.state):
            new_key = memo.get(id(key), key) if isinstance(key, torch.Tensor) else key
            extras[new_key] = copy.deepcopy(value, memo)
        new._remake(groups, copy.deepcopy(self.defaults, memo), self._config, self.overlap,
                    self.dsopt.state_dict(), extras, self.last_step_info)
        # What else the optimizer holds (torch's hook dicts, attributes of the
        # subclass or of the user).
        for key, value in self.__dict__.items():
            if key not in new.__dict__ or (key.startswith("_optimizer_") and
                                           key.endswith("_hooks")):
                new.__dict__[key] = copy.deepcopy(value, memo)
        return new

    def __reduce_ex__(self, protocol):
        """Pickling (``torch.save(opt)``, and what holds the optimizer, as
        torch 1.13's OneCycleLR state dict does): unpickled, it is a new
        optimizer over the unpickled parameters with this one's state, on a
        communicator of its own (one process), as ``copy.deepcopy`` makes.
        ``copy.copy`` gives such an optimizer over the same parameters.
        To checkpoint, ``state_dict()`` is the better way (it is what
        ``load_state_dict`` and ``load_state_dict_shards`` take)."""
        if self._shards is not None:
            raise refuse_rebuild("pickling (torch.save of the optimizer)")
        self._follow_params(collective=False)  # the blob's dtypes are the parameters'
        state = {"param_groups": self.param_groups, "defaults": self.defaults,
                 "config": self._config, "overlap": self.overlap,
                 "dsopt_state": self.dsopt.state_dict(),
                 "extras": dict(dict.items(self.state)), "last_step_info": self.last_step_info}
        return unpickle, (type(self), state)

    def _remake(self, groups, defaults, config, overlap, blob, extras, last_step_info):
        """Makes this object (new, not yet initialized) an optimizer over
        ``groups`` on a local communicator, with the dsopt state ``blob``
        and ``extras`` as the other keys of its ``state``."""
        local = Communicator.local()
        try:
            self._init_optimizer([dict(g) for g in groups], config, local, overlap=overlap,
                                 _defaults=defaults, _known_keys_only=True)
        except BaseException:
            local.close()
            raise
        self._owns_comm = True
        self.dsopt.load_state_dict(blob)
        self.state.invalidate()
        self.param_groups = groups
        self.defaults = defaults
        self._reset_hyperparameters()
        self._sync_hyperparameters()
        self.last_step_info = last_step_info
        for key, value in extras.items():
            dict.__setitem__(self.state, key, value)


def unpickle(cls, state):
    """An optimizer of ``cls`` over the parameters of ``state``'s groups
    with its dsopt state, on a local communicator (what
    ``RebuildMixin.__reduce_ex__`` pickles)."""
    new = cls.__new__(cls)
    new._remake(state["param_groups"], state["defaults"], state["config"], state["overlap"],
                state["dsopt_state"], state["extras"], state["last_step_info"])
    return new
