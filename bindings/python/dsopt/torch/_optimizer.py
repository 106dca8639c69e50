"""dsopt.torch: a ``torch.optim.Optimizer`` that runs dsopt.

    import dsopt.torch
    opt = dsopt.torch.Optimizer(model.parameters(), config, comm=None)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    for batch in data:
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        opt.step()
        sched.step()

* ``params``: tensors or torch-style parameter groups (dicts with
  ``"params"`` and per-group settings dsopt knows: ``lr``, ``betas``,
  ``eps``, ``weight_decay``, ``non_freeze``); each group becomes one dsopt
  ``param_groups`` entry, so ``config`` must not have its own.
* Tensors: contiguous float32 / float16 / bfloat16, on the CPU, or on the
  GPU with ``"device": "cuda"`` in the config; dsopt updates them in place
  through ``data_ptr()``. Gradients are read from ``.grad``; a parameter
  without one steps with a zero gradient (dsopt takes one per parameter).
* Learning rates: ``group["lr"]`` is read before every step and handed to
  dsopt when it changed, so LR schedulers work as with torch's optimizers.
* ``state_dict()`` is torch's (the groups' settings) plus this rank's dsopt
  state blob under ``"dsopt_state"``; ``load_state_dict`` restores both.
* ZeRO (``"zero_optimization": {"stage": 1 or 2, ...}`` in the config, Adam
  and AdamW): every rank keeps the optimizer state of its shard only, so
  each rank saves its own ``state_dict()``. ``load_state_dict`` takes this
  rank's own state dict back at the same world size;
  ``load_state_dict_shards(state_dicts)`` takes the state dicts of all
  ranks of the saved run, in rank order, and continues it at any world size
  and ZeRO stage (stage 0 -> 2, 2 ranks -> 4, ...; collective, every rank
  passes all of them). ``memory_usage()`` is the bytes dsopt holds here.
* Skipped steps (Inf/NaN gradients on some rank) warn
  ``dsopt.SkippedStepWarning`` (rate-limited); when the run stops
  progressing ``step`` raises ``dsopt.NonFiniteError`` (its ``.info`` is
  also ``last_step_info``), as ``dsopt.Optimizer.step`` does.
* ``comm``: a ``dsopt.Communicator``, an mpi4py communicator, a
  torch.distributed ``ProcessGroup``, or None. ``step`` is collective over
  it: with several ranks every rank steps with its local gradients and
  dsopt averages them. None means torch.distributed's default group when
  torch.distributed is initialised (``init_process_group``, as under
  ``torchrun``), else one process. A process group (given, or the default
  one) becomes ``dsopt.Communicator.from_torch(group)``, which this
  optimizer owns and closes: dsopt's collectives then run as
  torch.distributed collectives on that group (gloo: host memory; NCCL:
  CUDA memory, on torch's current stream at creation), with the group's
  timeout. On host memory dsopt sums floats itself in a fixed order, so the
  results are bit-identical to an MPI run of the same training. To keep a
  torch.distributed job's ranks independent pass
  ``comm=dsopt.Communicator.local()``.

      torch.distributed.init_process_group("gloo")  # env:// (torchrun)
      opt = dsopt.torch.Optimizer(model.parameters(), config)  # on the default group
* ``overlap=True`` (torch >= 2.1): a hook on every parameter
  (``register_post_accumulate_grad_hook``) hands its gradient to dsopt
  (``dsopt_grad_ready``) as soon as backward has produced it, so that the
  gradient reduction overlaps the rest of backward; ``step()`` completes
  the step. The hook then sets ``p.grad = None``: after backward ``.grad``
  is None, so code must not read or change ``.grad`` (clip with dsopt's
  ``"gradient_clipping"``). With ``"gradient_accumulation_steps"`` = G in
  the config, run G backward passes per ``step()``, each on its own
  micro-batch's loss (not divided by G): dsopt sums the G gradients and
  uses their mean. A parameter that gets no gradient in a backward pass
  contributes zeros to that micro-batch (a ``step()`` after no backward at
  all steps with zeros). With torch < 2.1 the constructor warns and
  ``step()`` hands ``.grad`` over instead, then sets it to None (same
  results, no overlap). ``close()`` removes the hooks.
* Gradient descriptors (``overlap=False``): ``step()`` keeps the
  ``dsopt_tensor`` descriptors of the last step's gradients and describes a
  parameter's ``.grad`` again only when it is another tensor object than
  at the last step (autograd accumulating into an existing ``.grad``, or
  ``zero_grad(set_to_none=False)``, keeps the object; ``set_to_none=True``
  makes new ones, which are described again). A ``.grad`` that stays the
  same object must keep its storage: after swapping it in place
  (``p.grad.set_(...)``, ``p.grad.data = ...``, ``p.grad.resize_(...)``)
  call ``clear_grad_cache()`` before the next ``step()``. Only weak
  references to the gradients are kept, so a dropped ``.grad`` is freed
  as before.
"""

import json
import operator
import warnings
import weakref
from collections.abc import Mapping

import torch

from ._torch_grads import TorchGradDescriptors
from .communicator import Communicator
from .errors import NonFiniteError
from .optimizer import Optimizer as _DsoptOptimizer
from .tensors import tensor_records

_get_grad = operator.attrgetter("grad")


def _config_dict(config) -> dict:
    if isinstance(config, (str, bytes, bytearray)):
        config = json.loads(config)
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict or JSON text, got {type(config).__name__}")
    if "param_groups" in config:
        raise ValueError("dsopt.torch.Optimizer builds param_groups from the torch parameter "
                         "groups; pass per-group settings in the groups instead")
    return config


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


def _hand_over_hook(owner_ref, index):
    """The post-accumulate-grad hook of parameter ``index``: hands its
    gradient to dsopt, then drops it (``p.grad = None``), so that the next
    backward pass starts the next micro-batch from nothing. ``owner_ref`` is
    a weak reference: the hooks do not keep the optimizer alive."""

    def hook(p):
        owner = owner_ref()
        grad = p.grad
        if owner is None or grad is None:
            return
        if grad.is_sparse:
            raise RuntimeError("dsopt.torch.Optimizer does not support sparse gradients")
        if not grad.is_contiguous():
            grad = grad.contiguous()
        if _on_side_stream(grad):
            # dsopt reads on its communicator's stream: wait for torch's.
            torch.cuda.current_stream(grad.device).synchronize()
        owner.dsopt.grad_ready(index, grad)
        owner._handed_over = True
        p.grad = None

    return hook


class Optimizer(torch.optim.Optimizer):
    """``Optimizer(params, config, comm=None, *, overlap=False)``: see the
    module doc."""

    def __init__(self, params, config, comm=None, *, overlap=False):
        config = _config_dict(config)
        lr = config.get("optimizer", {}).get("params", {}).get("lr", 1e-3)
        super().__init__(params, {"lr": lr})
        # Every setting of a torch group (lr, betas, ...) goes to dsopt, which
        # rejects the ones it does not know.
        settings = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        config = dict(config, param_groups=settings)
        tensors = [p for group in self.param_groups for p in group["params"]]
        group_of = [i for i, group in enumerate(self.param_groups) for _ in group["params"]]
        self._comm, self._owns_comm = _as_communicator(comm)
        self._zero_grads = {}
        try:
            self.dsopt = _DsoptOptimizer(config, tensors, self._comm, groups=group_of)
        except BaseException:
            if self._owns_comm:
                self._comm.close()
            raise
        self._grad_descriptors = TorchGradDescriptors(
            tensors, tensor_records(self.dsopt._params.c_array))
        self._on_cuda = any(p.is_cuda for p in tensors)
        self._dsopt_lrs = [group["lr"] for group in self.param_groups]
        self.last_step_info = None
        self._tensors = tensors  # dsopt's parameter order
        self._hooks = []
        self._hooked = False  # overlap through hooks (else, with overlap, at step)
        self._handed_over = False  # some gradient of this step was handed over
        self.overlap = bool(overlap)
        if self.overlap:
            if _has_post_accumulate_grad_hooks():
                owner = weakref.ref(self)
                # A frozen parameter gets no hook (torch allows none): it
                # contributes zeros, as it would without overlap.
                self._hooks = [p.register_post_accumulate_grad_hook(_hand_over_hook(owner, i))
                               for i, p in enumerate(tensors) if p.requires_grad]
                self._hooked = True
            else:
                warnings.warn(
                    f"dsopt.torch.Optimizer(overlap=True) needs torch >= 2.1 "
                    f"(Tensor.register_post_accumulate_grad_hook); this is torch "
                    f"{torch.__version__}. Falling back to reading .grad in step(): the "
                    f"results are the same, without overlapping the gradient reduction "
                    f"with backward.", RuntimeWarning, stacklevel=2)

    def add_param_group(self, param_group):
        if hasattr(self, "dsopt"):
            raise RuntimeError("dsopt.torch.Optimizer cannot add parameters after creation")
        super().add_param_group(param_group)

    def _sync_learning_rates(self):
        for i, group in enumerate(self.param_groups):
            if group["lr"] != self._dsopt_lrs[i]:
                self.dsopt.set_group_lr(i, group["lr"])
                self._dsopt_lrs[i] = group["lr"]

    def _gradient(self, p):
        if p.grad is None:
            zeros = self._zero_grads.get(p)
            if zeros is None:
                zeros = self._zero_grads[p] = torch.zeros_like(p)
            return zeros
        if p.grad.is_sparse:
            raise RuntimeError("dsopt.torch.Optimizer does not support sparse gradients")
        return p.grad.contiguous()

    def _hand_over_at_step(self):
        """overlap=True without hooks (torch < 2.1): every ``.grad`` handed
        over now, as the hooks would have at the end of backward (a
        parameter without one contributes zeros), then dropped. With
        gradient accumulation ``.grad`` holds the sum of the micro-batches,
        handed over as the first micro-batch; the others contribute zeros,
        so the step uses the same mean."""
        for i, p in enumerate(self._tensors):
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("dsopt.torch.Optimizer does not support sparse gradients")
            self.dsopt.grad_ready(i, grad.contiguous())
            self._handed_over = True
            p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        """One dsopt step with the parameters' ``.grad`` (collective), or
        with ``overlap=True`` the completion of the step whose gradients
        backward handed over. ``self.last_step_info`` holds what it did (a
        ``dsopt.StepInfo``). Skipped steps warn and a run that stops
        progressing raises ``dsopt.NonFiniteError``, as
        ``dsopt.Optimizer.step`` does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_learning_rates()
        if self.overlap:
            grads = None  # handed over by the hooks (or just below)
            on_side_stream = any(p.is_cuda for p in self._tensors[:1]) and \
                torch.cuda.current_stream().cuda_stream != torch.cuda.default_stream().cuda_stream
        else:
            # The gradients as .grad holds them; TorchGradDescriptors describes
            # the ones that changed since the last step (a gradient is on
            # its parameter's device).
            grads = list(map(_get_grad, self._tensors))
            self._grad_descriptors.update(grads, self._gradient)
            on_side_stream = self._on_cuda and \
                torch.cuda.current_stream().cuda_stream != torch.cuda.default_stream().cuda_stream
        if on_side_stream:
            # dsopt works on its communicator's stream (the legacy default
            # stream for a local one): order it after torch's stream.
            torch.cuda.current_stream().synchronize()
        if self.overlap:
            if not self._hooked:
                self._hand_over_at_step()
            if not self._handed_over:
                # No backward since the last step: zeros, as without overlap
                # (dsopt_step(NULL) needs a hand-over to complete).
                grads = [self._gradient(p) for p in self._tensors]
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
        return loss

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

    def memory_usage(self) -> dict:
        """Bytes dsopt holds for this optimizer on this rank,
        ``{"host": ..., "device": ...}`` (moments, fp32 masters, ZeRO shards,
        buffers; not the model's parameters or gradients)."""
        return self.dsopt.memory_usage()

    def state_dict(self):
        """torch's state dict (the groups' settings) plus this rank's dsopt
        state blob under ``"dsopt_state"``. Under ZeRO the blob holds this
        rank's shard only: save every rank's."""
        state = super().state_dict()
        state["dsopt_state"] = self.dsopt.state_dict()
        return state

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
            if len(saved.get("params", ())) != len(ours["params"]):
                raise ValueError(f"{what}: parameter group {i} has a different number of "
                                 f"parameters")

    def _restore(self, torch_part, load_dsopt):
        self._check_groups(torch_part)
        load_dsopt()
        super().load_state_dict(torch_part)
        self._dsopt_lrs = [self.dsopt.get_group_lr(i) for i in range(len(self.param_groups))]

    def load_state_dict(self, state_dict):
        """Restores the groups' settings and the dsopt state (collective):
        this rank's own ``state_dict()`` of a run at the same world size
        (see ``load_state_dict_shards`` for another world size or stage).
        Everything is checked before anything changes."""
        torch_part, blob = self._split(state_dict)
        self._restore(torch_part, lambda: self.dsopt.load_state_dict(blob))

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
        self._restore(parts[0][0], lambda: self.dsopt.load_state_dict_shards(blobs))

    def close(self):
        """Removes the overlap hooks and destroys the dsopt optimizer
        (collective); idempotent."""
        hooks, self._hooks = self._hooks, []
        for handle in hooks:
            handle.remove()
        self.dsopt.close()
        if self._owns_comm:
            self._comm.close()


__all__ = ["Optimizer"]
