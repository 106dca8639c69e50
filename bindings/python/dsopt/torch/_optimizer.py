"""dsopt.torch.Optimizer: the config-dict ``torch.optim.Optimizer`` that
runs dsopt (see the dsopt.torch module doc); the torch-style classes of
``_classes`` build on it. Two parts of the class live in modules of their
own, as classes it inherits from: making its dsopt optimizer again
(``_rebuild.RebuildMixin``: ``add_param_group``, parameters that moved,
copies, pickling) and its state dicts (``_state_dicts.StateDictMixin``)."""

import copy
import inspect
import json
import operator
import warnings
import weakref

import torch

from .._torch_grads import TorchGradDescriptors
from ..config import canonical as canonical_config
from ..errors import Mismatch, NonFiniteError
from ..optimizer import Optimizer as _DsoptOptimizer
from ..tensors import tensor_records
from . import _device, _groups
from ._communicator import as_communicator
from ._core import Facts, OptimizerCore
from ._dtensor import ShardedParams
from ._live_state import LiveState
from ._rebuild import RebuildMixin
from ._state_dicts import StateDictMixin
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


def _group_defaults(canonical, hyper, torch_flags) -> dict:
    """torch-style defaults of the groups: the algorithm's hyperparameters
    (``hyper``) of the canonical config's optimizer.params (defaults filled
    in by dsopt), a key of several values as a tuple, a flag as a bool;
    with ``torch_flags`` torch's flags too."""
    params = canonical["optimizer"]["params"]
    defaults = {key: tuple(params[key]) if len(names) > 1 else
                bool(params[key]) if key in hyper.flags else params[key]
                for key, names in hyper.keys.items()}
    if torch_flags:
        defaults.update(_groups.TORCH_FLAGS)
    return defaults


def _immutable(value) -> bool:
    """A group value that cannot change without being replaced (so an
    identical object means an unchanged value)."""
    if type(value) is tuple:
        return all(type(v) in (float, int) for v in value)
    return type(value) in (float, int)


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
# pieces behind the forward pass rather than in one at its start. Every
# codec, int8 included, decodes the same values at any bucket size
# (src/zero/param_gatherer.hpp), so overlap changes no value.
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
    mine.setdefault("allgather_bucket_size", _PREFETCH_BUCKET)  # no codec's values depend on it
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


class Optimizer(RebuildMixin, StateDictMixin, OptimizerCore, torch.optim.Optimizer):
    """``Optimizer(params, config, comm=None, *, overlap=False)``: a
    ``torch.optim.Optimizer`` running the dsopt optimizer the JSON
    ``config`` describes (see the dsopt.torch module doc). The classes
    ``dsopt.torch.Adam``, ``AdamW``, ..., one per algorithm of the
    library, build the config from torch-style arguments. What it can do
    comes from the algorithm's description (``dsopt.describe``).
    ``_defaults`` (the classes'): the groups' defaults beyond the
    hyperparameters, torch's flags included."""

    def __init__(self, params, config, comm=None, *, overlap=False, _defaults=None,
                 _known_keys_only=False):
        config = _config_dict(config)
        canonical = canonical_config(config)  # dsopt's defaults, aliases and rules
        if overlap:
            config = _with_prefetch(config, canonical)
        facts = Facts.of(canonical)
        defaults = _group_defaults(canonical, facts.hyper, torch_flags=_defaults is None)
        if _defaults:
            defaults.update(_defaults)
        super().__init__(params, defaults)
        for i, group in enumerate(self.param_groups):
            _groups.check_flags(group, f"param_groups[{i}]: ", facts.decoupled)
        self._facts = facts
        # Every other setting of a torch group goes to dsopt, which rejects
        # the ones it does not know.
        settings = [_groups.dsopt_settings(g, facts.hyper, all_keys=not _known_keys_only,
                                           where=f"param_groups[{i}]: ")
                    for i, g in enumerate(self.param_groups)]
        tensors = [p for group in self.param_groups for p in group["params"]]
        group_of = [i for i, group in enumerate(self.param_groups) for _ in group["params"]]
        # FSDP2's DTensors: dsopt updates their local shards (_dtensor).
        self._shards = ShardedParams.of(tensors, facts, overlap)
        device = _device.cuda_device(tensors)
        if device is not None and "device" not in config:
            config = dict(config, device="cuda")  # the parameters' device, as the classes infer
        with _device.current(device):  # where dsopt and torch's communicator work
            if self._shards is not None:
                self._comm, self._owns_comm = self._shards.communicator(comm, facts)
            else:
                self._comm, self._owns_comm = as_communicator(comm, canonical)
            try:
                _device.bind_comm(self._comm, device)
                subs = (self._comm.nodes or ()) + ((self._comm.shards,) if self._comm.shards else ()) \
                    if self._comm is not None else ()
                for sub in subs:
                    _device.bind_comm(sub, device)
                self.dsopt = _DsoptOptimizer(dict(config, param_groups=settings),
                                             self._dsopt_params(tensors), self._comm,
                                             groups=group_of)
            except BaseException:
                if self._owns_comm:
                    self._comm.close()
                elif self._shards is not None:
                    self._comm.set_shards(None)  # the caller's communicator, as it was given
                raise
        self._config = config  # without param_groups: add_param_group and deepcopy rebuild
        self._gathering = False  # a deferred parameter allgather is in flight
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
        self.state = LiveState(self, sharded=facts.zero_stage > 0, fsdp=self._shards)
        self._set_up(tensors)
        self._hooks = []
        self._unhooked = []  # overlap: parameters without a hook (frozen when hooks were made)
        # overlap: the first gradient of this step that a hook could not
        # hand over (sparse, another dtype); step() raises it on this rank
        # after failing the step on every rank
        self._unusable = None
        self._hooked = False  # overlap through hooks (else, with overlap, at step)
        self.overlap = bool(overlap)
        self._prefetch_handle = None
        self._state_dict_hooked = weakref.WeakSet()  # modules whose state_dict waits
        if self.overlap and self.dsopt.config["zero_optimization"]["deferred_allgather"]:
            handle = torch.nn.modules.module.register_module_forward_pre_hook(
                _prefetch_hook(weakref.ref(self)))
            self._prefetch_handle = handle
            weakref.finalize(self, handle.remove)
            self._record_forward_order()
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
        return _has_post_accumulate_grad_hooks()  # a module global: tests patch it here

    def _init_optimizer(self, *args, **kwargs):
        """This class's ``__init__`` (not a subclass's, whose arguments
        differ): what copies and unpickling make an optimizer with."""
        Optimizer.__init__(self, *args, **kwargs)

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
        # their storage as dsopt has it (of FSDP2 parameters: of their local shards)
        self._storage = ParamStorage(tensors, None if self._shards is None else self._shards.locals)
        self._index = {p: i for i, p in enumerate(tensors)}
        self._grad_descriptors = TorchGradDescriptors(
            tensors, tensor_records(self.dsopt._params.c_array))
        self._on_cuda = any(p.is_cuda for p in tensors)
        self._reset_hyperparameters()
        # The deferred allgather: each parameter's bucket, each module's
        # (the last of its own parameters' buckets; -1: none), how far this
        # step's buckets have been waited for.
        self._gathering = False
        self._last_bucket = self.dsopt.gather_buckets - 1
        self._bucket_of = [self.dsopt.gather_bucket_of(i) for i in range(len(tensors))]
        self._module_bucket = weakref.WeakKeyDictionary()
        self._waited_through = -1
        # The forward order (overlap=True under ZeRO with buckets to
        # order): the parameter indices in the order the forward pre-hook
        # first sees them, recorded until it is handed to dsopt before the
        # next step (_give_gather_order); None when not recording.
        self._forward_order = None
        self._forward_seen = set()
        if getattr(self, "_prefetch_handle", None) is not None:  # a rebuild: again
            self._record_forward_order()
        self.state.track(tensors, self._index)  # after a rebuild: its own views

    # ---- hyperparameters ------------------------------------------------------

    def _dsopt_hyper(self, group):
        """The hyperparameters dsopt has for ``group``, in the order of the
        algorithm's names (``self._facts.hyper.names``)."""
        return tuple(self.dsopt.get_group_param(group, name) for name in self._facts.hyper.names)

    def _reset_hyperparameters(self):
        """What dsopt has of every group's hyperparameters, taken afresh
        (the groups or dsopt's optimizer were replaced): the next
        ``_sync_hyperparameters`` compares every group with it."""
        self._hyper = [self._dsopt_hyper(i) for i in range(len(self.param_groups))]
        self._seen = [None] * len(self.param_groups)

    def _sync_hyperparameters(self):
        """Hands every group's hyperparameters (the algorithm's: lr, betas,
        eps and weight_decay for Adam) that changed since dsopt got them over
        to dsopt (before each step), validated as torch validates them
        (ValueError)."""
        seen = self._seen
        hyper = self._facts.hyper
        keys = tuple(hyper.keys)
        for i, group in enumerate(self.param_groups):
            values = tuple(group[key] for key in keys)
            known = seen[i]
            if known is not None and all(map(operator.is_, values, known)):
                continue
            new = hyper.values(group, f"param_groups[{i}]: ")
            old = list(self._hyper[i])
            try:
                for k, (name, value) in enumerate(zip(hyper.names, new)):
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
        hyper = self._facts.hyper
        for i, group in enumerate(self.param_groups):
            for key, value in hyper.by_key(self._dsopt_hyper(i)).items():
                group.setdefault(key, value)
            for key, value in self.defaults.items():
                if key not in hyper.keys:
                    group.setdefault(key, value)
            if "decoupled_weight_decay" in self.defaults:
                group["decoupled_weight_decay"] = self.defaults["decoupled_weight_decay"]
            _groups.check_flags(group, f"param_groups[{i}]: ")

    # ---- parameters that moved (see RebuildMixin) -----------------------------

    def _may_hand_over(self):
        """overlap: whether a hook may hand its gradient over now. The
        first hand-over of a step checks the parameters first: new storage
        is rebound here; a cast or a move to another device (a collective
        rebuild) waits for ``step()``, and the hooks leave ``.grad`` to it
        for the rest of the step."""
        if self._defer_to_step:
            return False
        if self._handed_over:
            return True
        if self._storage.moved():
            if self._needs_rebuild():
                self._defer_to_step = True
                return False
            self._follow_moved_params()
        self._give_gather_order()  # before the step's first hand-over
        return True

    # ---- stepping -------------------------------------------------------------

    def _dsopt_params(self, tensors=None):
        """What dsopt updates for the parameters ``tensors`` (default: this
        optimizer's): the tensors themselves, or the local shards of FSDP2's
        DTensors."""
        tensors = self._tensors if tensors is None else tensors
        return tensors if self._shards is None else self._shards.locals(tensors)

    def _gradient(self, p):
        """What a parameter with a ``.grad`` steps with (contiguous; the
        local shard of an FSDP2 gradient)."""
        if self._shards is not None:
            return self._shards.grad(p)
        _refuse_sparse(p.grad)
        return p.grad.contiguous()

    def _grads_now(self):
        """Every parameter's ``.grad`` as dsopt takes it (None: absent)."""
        if self._shards is not None:
            return self._shards.grads(self._tensors)
        return list(map(_get_grad, self._tensors))

    def _hand_over_at_step(self):
        """overlap=True without hooks (torch < 2.1), or in a step whose hooks
        left ``.grad`` to ``step()``: every ``.grad`` handed
        over now, as the hooks would have at the end of backward (a
        parameter without one is absent), then dropped. With gradient
        accumulation ``.grad`` holds the sum of the micro-batches, handed
        over as the last micro-batch's; the others contribute zeros, so the
        step uses the same mean."""
        self._hand_over(range(len(self._tensors)))

    def _hand_over_unseen(self):
        """overlap=True: the ``.grad`` that no hook saw (set
        without a backward pass: assigned, or from ``torch.autograd.grad``)
        handed over now, as overlap=False would step with it; the hooks
        drop what they hand over, so these are the only ``.grad`` left."""
        handed = self._handed_now
        self._hand_over(i for i, p in enumerate(self._tensors)
                        if p.grad is not None and i not in handed)

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
                    if not self._handed_over:
                        self._give_gather_order()  # before a rebuild, which records anew
                    self._follow_params()
                    if not self._hooked or self._defer_to_step:
                        self._hand_over_at_step()
                        self._defer_to_step = False
                    if self._unhooked:
                        self._hand_over_unhooked()
                    if self._unusable is not None:
                        raise self._unusable
                    self._hand_over_unseen()
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
                grads = self._grads_now()
                self._follow_params()  # after reading .grad, which warmed the parameters' memory
                self._grad_descriptors.update(grads, self._gradient)
                if self._shards is not None:
                    self._shards.mark_present(self._grad_descriptors.records, grads)
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

    def _record_forward_order(self):
        """Starts recording the forward order when the deferred allgather
        has buckets to order (at 2+ ranks: the same on every rank)."""
        if self._last_bucket > 0:
            self._forward_order = []
            self._forward_seen = set()
            self._module_bucket = weakref.WeakKeyDictionary()  # every module seen anew

    def _give_gather_order(self):
        """Hands the recorded forward order to dsopt (collective: every
        rank calls it before the first hand-over of the step, or in
        ``step()`` when nothing was handed over), parameters the forward
        never reached last, in parameter order; the buckets of the
        following steps arrive in that order. Ranks whose forward orders
        differ keep the parameter order (and warn)."""
        order, self._forward_order = self._forward_order, None
        if order is None:
            return
        self._forward_seen = set()
        seen = set(order)
        order = order + [i for i in range(len(self._tensors)) if i not in seen]
        try:
            self.dsopt.set_gather_order(order)
        except Mismatch as error:
            warnings.warn(f"dsopt.torch.Optimizer(overlap=True): the ranks' forward orders "
                          f"differ, so the parameter allgather keeps the parameter order ({error})",
                          RuntimeWarning, stacklevel=3)
            return
        self._bucket_of = [self.dsopt.gather_bucket_of(i) for i in range(len(self._tensors))]
        self._module_bucket = weakref.WeakKeyDictionary()
        self._waited_through = -1

    def _wait_for_module(self, module):
        bucket = self._module_bucket.get(module, _UNSEEN)
        if bucket is _UNSEEN:
            index = self._index
            mine = [index[p] for p in module._parameters.values() if p is not None and p in index]
            bucket = max((self._bucket_of[i] for i in mine), default=-1)
            self._module_bucket[module] = bucket
            if self._forward_order is not None:
                for i in mine:
                    if i not in self._forward_seen:
                        self._forward_seen.add(i)
                        self._forward_order.append(i)
            if mine and module not in self._state_dict_hooked:
                # model.state_dict() reads them: whole first
                self._state_dict_hooked.add(module)
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

    # ---- life cycle ------------------------------------------------------------

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
        elif self._shards is not None and self._comm is not None and not self._comm.closed:
            self._comm.set_shards(None)  # the caller's communicator, as it was given


__all__ = ["Optimizer"]
