"""dsopt.torch.Optimizer: the config-dict ``torch.optim.Optimizer`` that
runs dsopt (see the dsopt.torch module doc); the torch-style classes of
``_classes`` build on it."""

import copy
import inspect
import json
import operator
import warnings
import weakref
from collections.abc import Mapping

import torch

from .._torch_grads import TorchGradDescriptors
from ..communicator import Communicator
from ..config import canonical as canonical_config
from ..errors import NonFiniteError
from ..optimizer import Optimizer as _DsoptOptimizer
from ..tensors import tensor_records
from . import _checkpoint, _device, _groups, _rebuild, _torch_state
from ._live_state import LiveState
from ._storage import ParamStorage

_get_grad = operator.attrgetter("grad")


def _config_dict(config) -> dict:
    if isinstance(config, (str, bytes, bytearray)):
        config = json.loads(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or JSON text, got {type(config).__name__}")
    if "param_groups" in config:
        raise ValueError("dsopt.torch.Optimizer builds param_groups from the torch parameter "
                         "groups; pass per-group settings in the groups instead")
    return copy.deepcopy(config)


ONE_BIT = ("OneBitAdam", "OneBitLamb", "ZeroOneAdam")


def _group_defaults(canonical) -> dict:
    """torch-style defaults of the groups: the algorithm's hyperparameters
    of the canonical config's optimizer.params (defaults filled in by
    dsopt), a key of several values as a tuple."""
    params = canonical["optimizer"]["params"]
    hyper = _groups.hyper(canonical["optimizer"]["type"])
    defaults = {key: tuple(params[key]) if len(names) > 1 else params[key]
                for key, names in hyper.keys.items()}
    defaults.update(_groups.TORCH_FLAGS)
    return defaults


def _algorithm(canonical):
    """(type, decoupled weight decay, ZeRO stage) of a canonical config
    (the 1-bit optimizers have no adam_w_mode: they always decouple)."""
    optimizer = canonical["optimizer"]
    decoupled = bool(optimizer["params"].get("adam_w_mode", True))
    return optimizer["type"], decoupled, int(canonical["zero_optimization"]["stage"])


def _immutable(value) -> bool:
    """A group value that cannot change without being replaced (so an
    identical object means an unchanged value)."""
    if type(value) is tuple:
        return all(type(v) in (float, int) for v in value)
    return type(value) in (float, int)


def _torch_distributed():
    """torch.distributed when this torch build has it, else None."""
    if not hasattr(torch, "distributed") or not torch.distributed.is_available():
        return None
    return torch.distributed


def _is_process_group(comm) -> bool:
    """A torch ProcessGroup, or the marker new_group returns to non-members."""
    dist = _torch_distributed()
    if dist is None:
        return False
    return isinstance(comm, dist.ProcessGroup) or \
        comm is getattr(dist.GroupMember, "NON_GROUP_MEMBER", object())


def _as_communicator(comm):
    """(Communicator or None, whether this optimizer owns it)."""
    if isinstance(comm, Communicator):
        return comm, False
    if comm is None:
        dist = _torch_distributed()
        if dist is not None and dist.is_initialized():
            return Communicator.from_torch(), True
        return None, False
    if hasattr(comm, "py2f"):
        return Communicator.from_mpi4py(comm), True
    if _is_process_group(comm):
        return Communicator.from_torch(comm), True
    raise TypeError(f"comm must be a dsopt.Communicator, an mpi4py communicator or a "
                    f"torch.distributed ProcessGroup, got {type(comm).__name__}")


# torch.optim.Optimizer.zero_grad's default (torch 1.x: False, 2.x: True).
_ZERO_GRAD_DEFAULT = inspect.signature(torch.optim.Optimizer.zero_grad).parameters[
    "set_to_none"].default


def _has_post_accumulate_grad_hooks() -> bool:
    """torch >= 2.1: ``Tensor.register_post_accumulate_grad_hook``."""
    return hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def _on_side_stream(tensor) -> bool:
    """Whether torch's current stream for ``tensor``'s GPU is not the
    default stream (dsopt then has to wait for it)."""
    if not tensor.is_cuda:
        return False
    return torch.cuda.current_stream(tensor.device).cuda_stream != \
        torch.cuda.default_stream(tensor.device).cuda_stream


def _ready_for_dsopt(tensor):
    """``tensor``, once the work torch queued for it on a side stream has
    finished (dsopt reads on its communicator's stream)."""
    if _on_side_stream(tensor):
        torch.cuda.current_stream(tensor.device).synchronize()
    return tensor


# What torch.optim's own zero_grad and state_dict use: the function runs
# eagerly under torch.compile (dynamo does not trace into it: a graph
# break), and torch._dynamo is imported at the first call only (torch >=
# 2.1; torch.compile of an earlier torch traces the step and fails).
_run_eagerly = getattr(torch, "_disable_dynamo", lambda fn: fn)


def _refuse_sparse(grad):
    if grad.is_sparse:
        raise RuntimeError("dsopt.torch.Optimizer does not support sparse gradients")


def _hand_over_hook(owner_ref, index):
    """The post-accumulate-grad hook of parameter ``index``: hands its
    gradient to dsopt, then drops it (``p.grad = None``), so that the next
    backward pass starts the next micro-batch from nothing. ``owner_ref`` is
    a weak reference: the hooks do not keep the optimizer alive."""

    def hook(p):
        owner = owner_ref()
        grad = p.grad
        if owner is None or grad is None or not owner._may_hand_over():
            return
        try:
            _refuse_sparse(grad)
            owner.dsopt.grad_ready(index, _ready_for_dsopt(grad.contiguous()))
        except Exception as error:  # noqa: BLE001 - raised by step(), on every rank
            if owner._unusable is None:
                owner._unusable = error
            return
        owner._handed_over = True
        owner._handed_now.add(index)
        owner._grad_tensor.add(index)
        p.grad = None

    return hook


# overlap=True under ZeRO stage 1/2: the parameter allgather's bucket size
# when the config sets none (elements), so that the gather arrives in
# pieces behind the forward pass rather than in one at its start. Not with
# the int8 parameter codec, whose blocks start at each bucket's chunks: the
# bucket size changes its values there, and overlap must not.
_PREFETCH_BUCKET = 1 << 22
_UNSEEN = object()


def _with_prefetch(config, canonical):
    """``config`` with ZeRO's deferred allgather on (overlap=True), unless
    ZeRO is off or the config says otherwise."""
    zero = canonical.get("zero_optimization") or {}
    if zero.get("stage", 0) not in (1, 2):
        return config
    mine = dict(config.get("zero_optimization") or {})
    mine.setdefault("deferred_allgather", True)
    if (zero.get("compression") or {}).get("parameters") != "int8":
        mine.setdefault("allgather_bucket_size", _PREFETCH_BUCKET)
    return dict(config, zero_optimization=mine)


def _prefetch_hook(owner_ref):
    """The global forward pre-hook of overlap=True under ZeRO: a module
    that holds parameters of this optimizer waits for their bucket of the
    parameter allgather before it runs. A weak reference: the hook does not
    keep the optimizer alive."""

    def hook(module, args):
        opt = owner_ref()
        if opt is not None:
            opt._wait_for_module(module)

    return hook


def _state_dict_wait_hook(owner_ref):
    """A module's state_dict hook: the parameters whole before they are
    read (for ``model.state_dict()`` and ``torch.save``)."""

    def hook(*args):
        opt = owner_ref()
        if opt is not None:
            opt.wait_gathers()

    return hook


class Optimizer(torch.optim.Optimizer):
    """``Optimizer(params, config, comm=None, *, overlap=False)``: a
    ``torch.optim.Optimizer`` running the dsopt optimizer the JSON
    ``config`` describes (see the dsopt.torch module doc). The classes
    ``dsopt.torch.Adam``, ``AdamW``, ``OneBitAdam``, ``OneBitLamb`` and
    ``ZeroOneAdam`` build the config from torch-style arguments."""

    def __init__(self, params, config, comm=None, *, overlap=False, _defaults=None,
                 _known_keys_only=False):
        config = _config_dict(config)
        canonical = canonical_config(config)  # dsopt's defaults, aliases and rules
        if overlap:
            config = _with_prefetch(config, canonical)
        defaults = _group_defaults(canonical)
        if _defaults:
            defaults.update(_defaults)
        super().__init__(params, defaults)
        decoupled = _algorithm(canonical)[1]
        for i, group in enumerate(self.param_groups):
            _groups.check_flags(group, f"param_groups[{i}]: ", decoupled)
        # Every other setting of a torch group goes to dsopt, which rejects
        # the ones it does not know.
        self._hyper_params = _groups.hyper(canonical["optimizer"]["type"])
        settings = [_groups.dsopt_settings(g, self._hyper_params, all_keys=not _known_keys_only,
                                           where=f"param_groups[{i}]: ")
                    for i, g in enumerate(self.param_groups)]
        tensors = [p for group in self.param_groups for p in group["params"]]
        group_of = [i for i, group in enumerate(self.param_groups) for _ in group["params"]]
        device = _device.cuda_device(tensors)
        with _device.current(device):  # where dsopt and torch's communicator work
            self._comm, self._owns_comm = _as_communicator(comm)
            try:
                _device.bind_comm(self._comm, device)
                self.dsopt = _DsoptOptimizer(dict(config, param_groups=settings), tensors,
                                             self._comm, groups=group_of)
            except BaseException:
                if self._owns_comm:
                    self._comm.close()
                raise
        self._config = config  # without param_groups: add_param_group and deepcopy rebuild
        self._gathering = False  # a deferred parameter allgather is in flight
        self._type, self._decoupled, self._zero_stage = _algorithm(canonical)
        self.last_step_info = None
        self._handed_over = False  # some gradient of this step was handed over
        # overlap: the parameters handed over in this step, and those whose
        # .grad would be a tensor under torch (handed over at some step
        # since the last zero_grad(set_to_none=True)): the latter step with
        # zeros when not handed over, as a zeroed .grad does without overlap.
        self._handed_now = set()
        self._grad_tensor = set()
        # overlap: the hooks leave .grad to step() in this step (the
        # parameters were cast or moved: step() rebuilds, then hands over).
        self._defer_to_step = False
        self._set_up(tensors)
        self.state = LiveState(self)
        self._hooks = []
        self._unhooked = []  # overlap: parameters without a hook (frozen when hooks were made)
        # overlap: the first gradient of this step that a hook could not
        # hand over (sparse, another dtype); step() raises it on this rank
        # after failing the step on every rank
        self._unusable = None
        self._hooked = False  # overlap through hooks (else, with overlap, at step)
        self.overlap = bool(overlap)
        self._prefetch_handle = None
        if self.overlap and self.dsopt.config["zero_optimization"]["deferred_allgather"]:
            handle = torch.nn.modules.module.register_module_forward_pre_hook(
                _prefetch_hook(weakref.ref(self)))
            self._prefetch_handle = handle
            weakref.finalize(self, handle.remove)
        if self.overlap:
            if self._hooks_available():
                self._hooked = True
                self._hook(range(len(tensors)))
            else:
                warnings.warn(
                    f"dsopt.torch.Optimizer(overlap=True) needs torch >= 2.1 "
                    f"(Tensor.register_post_accumulate_grad_hook); this is torch "
                    f"{torch.__version__}. Falling back to reading .grad in step(): the "
                    f"results are the same, without overlapping the gradient reduction "
                    f"with backward.", RuntimeWarning, stacklevel=2)

    @staticmethod
    def _hooks_available():
        from . import _has_post_accumulate_grad_hooks  # looked up there: tests patch it
        return _has_post_accumulate_grad_hooks()

    def _hook(self, indices):
        """Post-accumulate-grad hooks on the parameters ``indices`` that
        require gradients; the others are handed over by ``step()`` (torch
        takes no hook on them) and get their hook once they require one."""
        owner = weakref.ref(self)
        for i in indices:
            p = self._tensors[i]
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(_hand_over_hook(owner, i)))
            else:
                self._unhooked.append(i)

    def _set_up(self, tensors):
        """What the optimizer keeps about dsopt's parameters (again after a
        rebuild)."""
        self._tensors = tensors  # dsopt's parameter order
        self._storage = ParamStorage(tensors)  # their storage as dsopt has it
        self._index = {p: i for i, p in enumerate(tensors)}
        self._grad_descriptors = TorchGradDescriptors(
            tensors, tensor_records(self.dsopt._params.c_array))
        self._on_cuda = any(p.is_cuda for p in tensors)
        self._hyper = [self._dsopt_hyper(i) for i in range(len(self.param_groups))]
        self._seen = [None] * len(self.param_groups)
        # The deferred allgather: each parameter's bucket, each module's
        # (the last of its own parameters' buckets; -1: none), how far this
        # step's buckets have been waited for.
        self._gathering = False
        self._last_bucket = self.dsopt.gather_buckets - 1
        self._bucket_of = [self.dsopt.gather_bucket_of(i) for i in range(len(tensors))]
        self._module_bucket = weakref.WeakKeyDictionary()
        self._waited_through = -1
        if isinstance(self.state, LiveState):  # not yet in __init__
            self.state.invalidate()  # views of the rebuilt optimizer

    # ---- hyperparameters ------------------------------------------------------

    def _dsopt_hyper(self, group):
        """The hyperparameters dsopt has for ``group``, in the order of the
        algorithm's names (``self._hyper_params.names``)."""
        return tuple(self.dsopt.get_group_param(group, name) for name in self._hyper_params.names)

    def _sync_hyperparameters(self):
        """Hands every group's hyperparameters (the algorithm's: lr, betas,
        eps and weight_decay for Adam) that changed since dsopt got them over
        to dsopt (before each step), validated as torch validates them
        (ValueError)."""
        seen = self._seen
        keys = tuple(self._hyper_params.keys)
        for i, group in enumerate(self.param_groups):
            values = tuple(group[key] for key in keys)
            known = seen[i]
            if known is not None and all(map(operator.is_, values, known)):
                continue
            new = self._hyper_params.values(group, f"param_groups[{i}]: ")
            old = list(self._hyper[i])
            try:
                for k, (name, value) in enumerate(zip(self._hyper_params.names, new)):
                    if value != old[k]:
                        if name == "lr":
                            self.dsopt.set_group_lr(i, value)
                        else:
                            self.dsopt.set_group_param(i, name, value)
                        old[k] = value
            finally:
                self._hyper[i] = tuple(old)
            seen[i] = values if all(map(_immutable, values)) else None

    def _normalize_groups(self):
        """Gives every group the keys torch's groups have: the
        hyperparameters (dsopt's values where a loaded group lacks them)
        and torch's flags; each group checked."""
        for i, group in enumerate(self.param_groups):
            for key, value in self._hyper_params.by_key(self._dsopt_hyper(i)).items():
                group.setdefault(key, value)
            for key, value in self.defaults.items():
                if key not in self._hyper_params.keys:
                    group.setdefault(key, value)
            if "decoupled_weight_decay" in self.defaults:
                group["decoupled_weight_decay"] = self.defaults["decoupled_weight_decay"]
            _groups.check_flags(group, f"param_groups[{i}]: ")

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
        (call it between steps). The 1-bit optimizers take new groups only
        before their first step (their compressed state and stages span
        all parameters); ZeRO stage 1/2 on several ranks only while no
        parameter has state (the shards move)."""
        if not hasattr(self, "dsopt"):  # torch's __init__ adding the first groups
            super().add_param_group(param_group)
            return
        _rebuild.add_param_group(self, param_group, super().add_param_group)

    # ---- parameters that moved -----------------------------------------------

    def _follow_params(self, collective=True):
        """Points dsopt at the parameters' current storage when some
        parameter's storage, dtype or device changed since dsopt took it
        (``model.to(...)``, ``p.data = ...``): before every step and before
        anything else that has dsopt read or write them (see the module
        doc and ``_rebuild.follow_params``; ``collective`` False where
        other ranks need not call at the same time)."""
        if self._storage.moved():
            _rebuild.follow_params(self, collective)

    def _may_hand_over(self):
        """overlap: whether a hook may hand its gradient over now. The
        first hand-over of a step checks the parameters first: new storage
        is rebound here; a cast or a move to another device (a collective
        rebuild) waits for ``step()``, and the hooks leave ``.grad`` to it
        for the rest of the step."""
        if self._defer_to_step:
            return False
        if self._handed_over or not self._storage.moved():
            return True
        if _rebuild.needs_rebuild(self):
            self._defer_to_step = True
            return False
        _rebuild.follow_params(self)
        return True

    # ---- stepping -------------------------------------------------------------

    def _gradient(self, p):
        """What a parameter with a ``.grad`` steps with (contiguous)."""
        _refuse_sparse(p.grad)
        return p.grad.contiguous()

    def _hand_over_at_step(self):
        """overlap=True without hooks (torch < 2.1), or in a step whose hooks
        left ``.grad`` to ``step()``: every ``.grad`` handed
        over now, as the hooks would have at the end of backward (a
        parameter without one is absent), then dropped. With gradient
        accumulation ``.grad`` holds the sum of the micro-batches, handed
        over as the last micro-batch's; the others contribute zeros, so the
        step uses the same mean."""
        self._hand_over(range(len(self._tensors)))

    def _hand_over(self, indices):
        for i in indices:
            p = self._tensors[i]
            grad = p.grad
            if grad is None:
                continue
            _refuse_sparse(grad)
            self.dsopt.grad_ready(i, _ready_for_dsopt(grad.contiguous()))
            self._handed_over = True
            self._handed_now.add(i)
            self._grad_tensor.add(i)
            p.grad = None

    def _hand_over_zeros(self):
        """overlap: zeros for the parameters whose .grad torch would have
        zeroed (``zero_grad(set_to_none=False)``) and that got no gradient
        in this step, as overlap=False steps them."""
        missing = sorted(self._grad_tensor.difference(self._handed_now))
        if not missing:
            return
        tensors = self._tensors
        zeros = _ready_for_dsopt(torch.zeros(max(tensors[i].numel() for i in missing),
                                             dtype=torch.float32, device=tensors[missing[0]].device))
        for i in missing:  # dsopt reads each before grad_ready returns
            self.dsopt.grad_ready(i, zeros[:tensors[i].numel()])
        self._handed_over = True

    @_run_eagerly
    def zero_grad(self, set_to_none=_ZERO_GRAD_DEFAULT):
        """torch's ``zero_grad`` (same default as the running torch's)."""
        super().zero_grad(set_to_none)
        if set_to_none:
            self._grad_tensor.clear()

    def _hand_over_unhooked(self):
        """overlap=True: the parameters that had no hook (frozen when the
        hooks were made) hand their ``.grad`` over here, and get a hook
        once they require gradients."""
        unhooked = self._unhooked
        self._hand_over(unhooked)  # may raise (sparse): then they stay unhooked
        self._unhooked = []
        self._hook(unhooked)

    @_run_eagerly
    @torch.no_grad()
    def step(self, closure=None):
        """One dsopt step with the parameters' ``.grad`` (collective), or
        with ``overlap=True`` the completion of the step whose gradients
        backward handed over. A parameter whose ``.grad`` is None has no
        gradient in this step (see the module doc). ``closure`` (optional)
        re-evaluates the model and returns the loss, as in torch.
        ``self.last_step_info`` holds what it did (a ``dsopt.StepInfo``).
        Skipped steps warn and a run that stops progressing raises
        ``dsopt.NonFiniteError``, as ``dsopt.Optimizer.step`` does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # An invalid hyperparameter on this rank fails the step everywhere
        # (ValueError here, Mismatch naming this rank on the others).
        with self.dsopt._failing_everywhere(self.dsopt._live()):
            self._sync_hyperparameters()
        if self.overlap:
            grads = None  # handed over by the hooks (or just below, each once ready)
            # A gradient that could not be handed over (sparse, another
            # dtype) fails the step on every rank: dsopt completes the
            # reductions already started, then every rank raises.
            try:
                with self.dsopt._failing_everywhere(self.dsopt._live()):
                    self._follow_params()
                    if not self._hooked or self._defer_to_step:
                        self._hand_over_at_step()
                        self._defer_to_step = False
                    if self._unhooked:
                        self._hand_over_unhooked()
                    if self._unusable is not None:
                        raise self._unusable
                    self._hand_over_zeros()
            finally:
                self._unusable = None
                self._handed_now = set()
                self._handed_over = False
            # grads stays None: every rank completes with dsopt_step(NULL),
            # the same collective call whether or not it handed anything
            # over (a rank that handed nothing over contributes zeros; a
            # parameter that no rank handed over is absent, as .grad None
            # is without overlap).
        else:
            # The gradients as .grad holds them; TorchGradDescriptors describes
            # the ones that changed since the last step (a gradient is on
            # its parameter's device; None is an absent gradient).
            # A gradient dsopt cannot take (sparse, another dtype) fails
            # the step on every rank, not only here (_failing_everywhere).
            with self.dsopt._failing_everywhere(self.dsopt._live()):
                grads = list(map(_get_grad, self._tensors))
                self._follow_params()  # after reading .grad, which warmed the parameters' memory
                self._grad_descriptors.update(grads, self._gradient)
        on_side_stream = self._on_cuda and _on_side_stream(self._tensors[0])
        if on_side_stream:
            # dsopt works on its communicator's stream (the legacy default
            # stream for a local one): order it after torch's stream.
            torch.cuda.current_stream(self._tensors[0].device).synchronize()
        try:
            self._handed_over = False
            if self.overlap:
                self.last_step_info = self.dsopt.step(grads)
            else:
                self.last_step_info = self.dsopt._step_with(
                    self.dsopt._live(), self._grad_descriptors.c_array, len(grads), 3)
        except NonFiniteError as error:
            self.last_step_info = error.info  # that step was skipped, like any other
            raise
        finally:
            self._grad_descriptors.copies = ()  # the step's contiguous copies, now unused
            if on_side_stream:
                torch.cuda.synchronize()
        if self._prefetch_handle is not None and self._last_bucket >= 0:
            # the buckets arrive behind the next forward (_prefetch_hook)
            self._gathering = True
            self._waited_through = -1
        return loss

    # ---- the deferred parameter allgather (overlap=True under ZeRO) ----------

    def wait_gathers(self):
        """Waits until every parameter is whole after a step whose
        parameter allgather runs behind the next forward pass (overlap=True
        under ZeRO stage 1/2). A module's forward, ``state_dict()``,
        ``opt.state``, the next step and every other call on the optimizer
        wait by themselves; call it before reading parameters some other
        way (a parameter used outside its own module's forward, ``p.data``
        read directly)."""
        if self._gathering:
            self._gathering = False
            self.dsopt.wait_gather(-1)

    def _wait_for_module(self, module):
        bucket = self._module_bucket.get(module, _UNSEEN)
        if bucket is _UNSEEN:
            index = self._index
            buckets = [self._bucket_of[index[p]] for p in module._parameters.values()
                       if p is not None and p in index]
            bucket = max(buckets, default=-1)
            self._module_bucket[module] = bucket
            if buckets:
                # model.state_dict() reads them: whole first
                register = getattr(module, "register_state_dict_pre_hook", None)
                if register is not None:
                    register(_state_dict_wait_hook(weakref.ref(self)))
                else:
                    module._register_state_dict_hook(_state_dict_wait_hook(weakref.ref(self)))
        if self._gathering and bucket > self._waited_through:
            if bucket >= self._last_bucket:
                self.wait_gathers()
            else:
                self.dsopt.wait_gather_bucket(bucket)
            self._waited_through = bucket

    def clear_grad_cache(self):
        """Forgets the gradient descriptors kept from the last ``step()``:
        the next step describes every ``.grad`` afresh (needed after a
        ``.grad`` tensor's storage was swapped in place; see the module
        doc)."""
        self._grad_descriptors.clear()

    @property
    def loss_scale(self) -> float:
        """Scale to multiply the next loss by (1.0 without fp16 loss scaling)."""
        return self.dsopt.loss_scale

    @property
    def gradient_clipping(self) -> float:
        """dsopt's clipping of the averaged gradients' global norm
        (``gradient_clipping``; 0.0: off). Settable between steps, with the
        same value on every rank: frameworks hand their own max-norm
        setting to it (``dsopt.hf.Trainer``'s ``max_grad_norm``,
        ``DsoptStrategy``'s ``gradient_clip_val``)."""
        return self.dsopt.gradient_clipping

    @gradient_clipping.setter
    def gradient_clipping(self, max_norm):
        self.dsopt.gradient_clipping = max_norm
        self._config["gradient_clipping"] = float(max_norm)  # kept by rebuilds

    def memory_usage(self) -> dict:
        """Bytes dsopt holds for this optimizer on this rank,
        ``{"host": ..., "device": ...}`` (moments, fp32 masters, ZeRO shards,
        buffers; not the model's parameters or gradients)."""
        return self.dsopt.memory_usage()

    # ---- state dicts ----------------------------------------------------------

    def _pack_groups(self):
        """torch's ``param_groups`` of a state dict (parameters as indices)."""
        packed, start = [], 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            packed.append(entry)
        return packed

    def state_dict(self):
        """torch's state dict of the groups' settings (``"state"`` is
        empty) plus this rank's dsopt state blob under ``"dsopt_state"``.
        Under ZeRO the blob holds this rank's shard only: save every
        rank's. ``torch_state_dict()`` gives torch.optim's format."""
        self._follow_params(collective=False)  # the blob's dtypes are the parameters'
        self._sync_hyperparameters()  # the blob saves the groups' current values
        for hook in getattr(self, "_optimizer_state_dict_pre_hooks", {}).values():
            hook(self)
        state_dict = {"state": {}, "param_groups": self._pack_groups(),
                      "dsopt_state": self.dsopt.state_dict()}
        for hook in getattr(self, "_optimizer_state_dict_post_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def state_dict_all_ranks(self, dst=0):
        """A whole checkpoint of a run on several ranks (collective: every
        rank calls it): on rank ``dst`` ``state_dict()`` plus
        ``"dsopt_rank_states"``, the dsopt blobs of every rank in rank
        order; None on the other ranks. This is the one file to save when a
        framework saves from rank 0 only: ``load_state_dict`` of it on every
        rank loads each rank's own blob at the same world size (1-bit
        compression errors and ZeRO shards included) and reshards or resets
        at another (as ``load_state_dict_shards``). The blobs are gathered
        through torch.distributed (a torch group) or mpi4py; other
        communicators raise ValueError (save ``state_dict()`` on every
        rank). Rank ``dst`` holds every rank's blob at once."""
        return _checkpoint.state_dict_all_ranks(self, dst)

    def torch_state_dict(self):
        """This optimizer's state as torch.optim's own ``state_dict()``
        (Adam and AdamW): ``torch.optim.AdamW`` (``torch.optim.Adam`` for
        L2 weight decay, as ``dsopt.torch.Adam``) over the same parameters
        loads it with ``load_state_dict`` and continues the run. ``"state"``
        maps parameter indices to ``{"step": 0-d tensor (float32; float64
        under a float64 default dtype), "exp_avg", "exp_avg_sq"}`` (copies, in the parameter's dtype and device) for
        the parameters dsopt has updated; ``"param_groups"`` has every key
        of the running torch version's groups. Raises ValueError for the
        1-bit optimizers (no torch counterpart) and under ZeRO stage 1/2 on
        several ranks (each rank holds part of the state)."""
        self._follow_params(collective=False)
        return _torch_state.export_state_dict(self)

    def _torch_class(self):
        """The torch.optim class whose state dicts match this optimizer's
        (Adam/AdamW)."""
        if not self._decoupled:
            return torch.optim.Adam
        if self._type == "Adam" and "decoupled_weight_decay" in self.defaults:
            return torch.optim.Adam  # torch >= 2.6: Adam(decoupled_weight_decay=True)
        return torch.optim.AdamW

    @staticmethod
    def _split(state_dict, what="state dict"):
        """(torch's part, the dsopt blob) of one of our state dicts."""
        if not isinstance(state_dict, Mapping) or state_dict.get("dsopt_state") is None:
            raise ValueError(f"{what} is not a dsopt.torch.Optimizer state dict "
                             f"(no 'dsopt_state')")
        torch_part = dict(state_dict)
        return torch_part, torch_part.pop("dsopt_state")

    def _check_groups(self, torch_part, what="state dict"):
        """torch's own checks of load_state_dict, made before dsopt changes
        anything, so a mismatch leaves both untouched."""
        groups = torch_part.get("param_groups")
        if not isinstance(groups, (list, tuple)) or len(groups) != len(self.param_groups):
            raise ValueError(f"{what} has a different number of parameter groups")
        for i, (saved, ours) in enumerate(zip(groups, self.param_groups)):
            if not isinstance(saved, Mapping) or \
                    len(saved.get("params", ())) != len(ours["params"]):
                raise ValueError(f"{what}: parameter group {i} has a different number of "
                                 f"parameters")
            _groups.check_flags(saved, f"{what}: param_groups[{i}]: ", self._decoupled)
            merged = dict(ours)
            merged.update({k: v for k, v in saved.items() if k in self._hyper_params.keys})
            self._hyper_params.values(merged, f"{what}: param_groups[{i}]: ")

    def _set_groups(self, saved_groups):
        """torch's load_state_dict: the saved groups' settings with this
        optimizer's parameters; then dsopt gets their hyperparameters."""
        groups = []
        for saved, ours in zip(copy.deepcopy(list(saved_groups)), self.param_groups):
            saved = dict(saved)
            saved["params"] = ours["params"]
            if "param_names" in ours and "param_names" not in saved:
                saved["param_names"] = ours["param_names"]
            groups.append(saved)
        self.param_groups = groups
        self._normalize_groups()
        self._hyper = [self._dsopt_hyper(i) for i in range(len(groups))]
        self._seen = [None] * len(groups)
        self._sync_hyperparameters()

    def _restore(self, torch_part, load_dsopt):
        self._check_groups(torch_part)
        try:
            load_dsopt()
        finally:
            self.state.invalidate()  # the load rebuilds the 1-bit compression buffers
        self._set_groups(torch_part["param_groups"])

    def load_state_dict(self, state_dict, *, reset_rank_local=False):
        """Restores a state dict (collective): this rank's own
        ``state_dict()`` of a run at the same world size (see
        ``load_state_dict_shards`` for another world size or stage), which
        restores the dsopt state and the groups' settings (their
        hyperparameters handed to dsopt); a whole checkpoint of
        ``state_dict_all_ranks()`` (the same file on every rank: each rank
        takes its own blob at the saved world size, and the whole set as
        ``load_state_dict_shards`` at another); or, for Adam/AdamW, a
        ``torch.optim.Adam``/``AdamW`` state dict (no ``"dsopt_state"``):
        its moments and step counts are written into dsopt's state (this
        rank's part under ZeRO), its groups' settings become this
        optimizer's; load the model's parameters first (16-bit parameters'
        fp32 masters are taken from them). Not collective then. Everything
        is checked before anything changes.

        A state dict another rank saved at the same world size is
        ``dsopt.Mismatch`` when its state is partly rank-local (the 1-bit
        optimizers' compression errors, 0/1 Adam's local state, ZeRO
        shards): load this rank's own, or a whole checkpoint. With
        ``reset_rank_local=True`` the 1-bit optimizers load it anyway,
        their rank-local state reset as at a change of world size, and
        warn that they did (ZeRO shards cannot be reset)."""
        state_dict = dict(state_dict) if isinstance(state_dict, Mapping) else state_dict
        self._follow_params()  # the load writes 16-bit parameters from their masters
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        if _torch_state.is_torch_state_dict(state_dict):
            _torch_state.load_torch_state_dict(self, state_dict)
        else:
            torch_part, blob = self._split(state_dict)
            blob, blobs = _checkpoint.own_blob_or_set(self, blob, torch_part)
            torch_part.pop(_checkpoint.RANK_STATES, None)
            if blobs is None:
                self._restore(torch_part, lambda: _checkpoint.load_blob(self, blob,
                                                                        reset_rank_local))
            else:
                self._restore(torch_part, lambda: self.dsopt.load_state_dict_shards(blobs))
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def load_state_dict_shards(self, state_dicts):
        """Restores a run saved at any world size from the ``state_dict()``
        of every one of its ranks, in rank order (collective: every rank
        passes the whole list). Adam/AdamW reshard the ZeRO shards (or
        stage-0 state) into this rank's shard at this optimizer's stage;
        the other optimizers load replicated state. The groups' settings
        come from ``state_dicts[0]``. A one-process run's single state dict
        is a complete list. Everything is checked before anything changes:
        dsopt rejects missing, duplicated or misordered shards and shards of
        different runs or steps (``dsopt.Mismatch``)."""
        if isinstance(state_dicts, Mapping):
            raise TypeError("load_state_dict_shards takes a list of state dicts, one per "
                            "rank of the saved run; for this rank's own use load_state_dict")
        parts = [self._split(sd, f"state_dicts[{i}]") for i, sd in enumerate(state_dicts)]
        if not parts:
            raise ValueError("load_state_dict_shards needs at least one state dict "
                             "(one per rank of the saved run)")
        blobs = [blob for _, blob in parts]
        self._follow_params()  # the load writes 16-bit parameters from their masters
        self._restore(parts[0][0], lambda: self.dsopt.load_state_dict_shards(blobs))

    # ---- copies and life cycle ------------------------------------------------

    def __deepcopy__(self, memo):
        """``copy.deepcopy(opt)``: a new optimizer of the same kind over
        deep copies of the parameters (through ``memo``, so that copying a
        model and its optimizer together keeps them connected) with the
        same state, on a communicator of its own (one process: an
        optimizer on several ranks raises, since creating one is
        collective)."""
        return _rebuild.deepcopy_optimizer(self, memo)

    def __reduce_ex__(self, protocol):
        """Pickling (``torch.save(opt)``, and what holds the optimizer, as
        torch 1.13's OneCycleLR state dict does): unpickled, it is a new
        optimizer over the unpickled parameters with this one's state, on a
        communicator of its own (one process), as ``copy.deepcopy`` makes.
        ``copy.copy`` gives such an optimizer over the same parameters.
        To checkpoint, ``state_dict()`` is the better way (it is what
        ``load_state_dict`` and ``load_state_dict_shards`` take)."""
        return _rebuild.unpickle, (type(self), _rebuild.pickled_state(self))

    def close(self):
        """Removes the overlap hooks and destroys the dsopt optimizer
        (collective); idempotent."""
        hooks, self._hooks = self._hooks, []
        for handle in hooks:
            handle.remove()
        if self._prefetch_handle is not None:
            self._prefetch_handle.remove()
            self._prefetch_handle = None
        self._gathering = False
        self.dsopt.close()  # waits for the gathers in flight
        if self._owns_comm:
            self._comm.close()


__all__ = ["Optimizer"]
