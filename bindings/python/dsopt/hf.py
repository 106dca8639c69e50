"""dsopt.hf: Hugging Face transformers' ``Trainer`` running a dsopt.torch
optimizer on every rank (docs/frameworks/hf-trainer.md).

    import dsopt.hf, dsopt.torch
    trainer = dsopt.hf.Trainer(
        model=model, args=TrainingArguments(..., max_grad_norm=1.0), train_dataset=data,
        optimizer_cls_and_kwargs=(dsopt.torch.AdamW, {"lr": 1e-3}))
    trainer.train()

``dsopt.hf.Trainer`` takes ``transformers.Trainer``'s arguments. With a
dsopt.torch optimizer (``optimizers=(opt, scheduler)``, or
``optimizer_cls_and_kwargs`` naming a dsopt.torch class) it differs from
``transformers.Trainer`` in three ways:

* One reduction, dsopt's: on several ranks the model that accelerate wraps
  in DistributedDataParallel gets ``dsopt.torch.ddp_comm_hook``, so that
  DDP sends nothing and dsopt averages the gradients (plain, 1-bit
  compressed or ZeRO's reduce-scatter) in its step. ``.grad`` then holds
  each rank's own gradient, not the average.
* Clipping is dsopt's: ``max_grad_norm`` > 0 clips the global norm of the
  averaged gradient inside dsopt's step (its ``gradient_clipping``); the
  Trainer does not call ``clip_grad_norm_`` on ``.grad``. An optimizer the
  Trainer creates gets ``gradient_clipping=max_grad_norm``; one passed in
  that does not clip gets it too (as transformers.Trainer would clip it);
  one passed in that clips at another value is a ValueError (say which you
  mean: ``max_grad_norm=0`` keeps the optimizer's own setting). The logged
  ``grad_norm`` is dsopt's (``last_step_info.grad_norm``, the norm of the
  averaged gradient before clipping), logged where dsopt computes it.
* Whole checkpoints: ``optimizer.pt`` holds every rank's dsopt state
  (``state_dict_all_ranks``; collective, written by the saving rank), and
  ``resume_from_checkpoint`` loads it on every rank: each rank its own
  state at the same world size, resharded (ZeRO) or with rank-local state
  reset (1-bit) at another.

With any other optimizer (``torch.optim``, or the Trainer's default) it is
``transformers.Trainer`` unchanged. transformers is imported here only:
``import dsopt`` and ``import dsopt.torch`` never import it.
"""

import os
import warnings

import torch
import transformers
from transformers.trainer_pt_utils import reissue_pt_warnings

from . import torch as dsopt_torch

OPTIMIZER_NAME = "optimizer.pt"  # transformers.trainer's names of the files
SCHEDULER_NAME = "scheduler.pt"

# transformers.Trainer's methods overridden below: without them (another
# transformers) the overrides would be silently skipped.
_OVERRIDDEN = ("create_optimizer", "_prepare_for_training", "_clip_grad_norm",
               "_get_grad_norm", "_maybe_log_save_evaluate", "_save_optimizer_and_scheduler")
_missing = [name for name in _OVERRIDDEN if not hasattr(transformers.Trainer, name)]
if _missing:
    raise ImportError(
        f"dsopt.hf.Trainer needs transformers >= 5 (transformers {transformers.__version__}'s "
        f"Trainer has no {', '.join(_missing)})")


def dsopt_optimizer(optimizer):
    """The dsopt.torch optimizer ``optimizer`` is or wraps (accelerate's
    ``AcceleratedOptimizer``), else None."""
    for _ in range(4):
        if optimizer is None or isinstance(optimizer, dsopt_torch.Optimizer):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return None


def _is_dsopt_class(cls):
    return isinstance(cls, type) and issubclass(cls, dsopt_torch.Optimizer)


def _clipping(optimizer):
    """The ``gradient_clipping`` a dsopt.torch optimizer has
    (0: none)."""
    return optimizer.gradient_clipping


def _kwargs_clipping(kwargs):
    """The clipping that ``optimizer_cls_and_kwargs``' kwargs ask for: the
    ``gradient_clipping`` argument, or a config dict's key (None: unset)."""
    config = kwargs.get("config")
    if isinstance(config, dict):
        return config.get("gradient_clipping")
    return kwargs.get("gradient_clipping")


def _with_clipping(kwargs, max_grad_norm):
    """``kwargs`` (a copy) with ``gradient_clipping = max_grad_norm``."""
    kwargs = dict(kwargs)
    if isinstance(kwargs.get("config"), dict):
        kwargs["config"] = dict(kwargs["config"], gradient_clipping=max_grad_norm)
    else:
        kwargs["gradient_clipping"] = max_grad_norm
    return kwargs


def _clipping_error(max_grad_norm, clipping):
    current = f"clips at {clipping:g}" if clipping > 0 else "does not clip"
    return ValueError(
        f"dsopt.hf.Trainer: max_grad_norm={max_grad_norm:g} (TrainingArguments) but the dsopt "
        f"optimizer {current}. dsopt clips the averaged gradient inside its step (.grad holds "
        f"each rank's own gradient), so max_grad_norm is the optimizer's gradient_clipping: "
        f"create it with gradient_clipping={max_grad_norm:g} (or pass optimizer_cls_and_kwargs "
        f"and the Trainer sets it), or set max_grad_norm=0 to keep the optimizer's own setting.")


def _find_ddp(model):
    """The DistributedDataParallel module ``model`` is or wraps
    (torch.compile's ``_orig_mod``), else None."""
    ddp = torch.nn.parallel.DistributedDataParallel
    for _ in range(4):
        if model is None or isinstance(model, ddp):
            return model
        model = getattr(model, "_orig_mod", None)
    return None


def _has_dsopt_hook(ddp):
    return any(hook is dsopt_torch.ddp_comm_hook for hook, _ in getattr(ddp, "_comm_hooks", ()))


class Trainer(transformers.Trainer):
    """``transformers.Trainer`` (same constructor) that runs a dsopt.torch
    optimizer as the one reduction of gradients, with dsopt's clipping and
    whole checkpoints (see the module doc); with other optimizers it is
    ``transformers.Trainer`` unchanged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        given = dsopt_optimizer(self.optimizer)
        if given is not None:
            self._check_dsopt_optimizer(given)
        elif self.optimizer_cls_and_kwargs is not None:
            cls, cls_kwargs = self.optimizer_cls_and_kwargs
            clipping = _kwargs_clipping(cls_kwargs)
            if _is_dsopt_class(cls) and self._max_grad_norm() > 0 and clipping is not None and \
                    float(clipping) != self._max_grad_norm():
                raise _clipping_error(self._max_grad_norm(), float(clipping))

    def _max_grad_norm(self):
        return float(self.args.max_grad_norm or 0)

    @property
    def dsopt_optimizer(self):
        """The dsopt.torch optimizer this Trainer steps, or None (another
        optimizer, or none created yet)."""
        return dsopt_optimizer(self.optimizer)

    def _check_dsopt_optimizer(self, opt):
        """ValueError unless this Trainer can run ``opt`` (see the module
        doc): its clipping is max_grad_norm's (given to it when it does not
        clip), its ranks the Trainer's processes, gradients read from
        ``.grad``, no per-rank decisions to skip a step, DDP (or one
        process) rather than FSDP or DeepSpeed."""
        max_grad_norm = self._max_grad_norm()
        if max_grad_norm > 0 and _clipping(opt) not in (0.0, max_grad_norm):
            raise _clipping_error(max_grad_norm, _clipping(opt))
        size = opt.dsopt.communicator.size
        if size != self.args.world_size:
            raise ValueError(
                f"dsopt.hf.Trainer: the dsopt optimizer runs on {size} rank(s), the Trainer on "
                f"{self.args.world_size} process(es): create it on torch.distributed's default "
                f"group (comm=None, after the TrainingArguments exist), as the Trainer does with "
                f"optimizer_cls_and_kwargs.")
        if opt.overlap:
            raise ValueError(
                "dsopt.hf.Trainer: the optimizer has overlap=True, which hands gradients over "
                "during backward and drops .grad; the Trainer's gradient accumulation and DDP "
                "read .grad. Create it with overlap=False.")
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            raise ValueError(
                "dsopt.hf.Trainer: a dsopt optimizer runs data-parallel training (DDP or one "
                "process), not FSDP or DeepSpeed: remove fsdp/deepspeed from the "
                "TrainingArguments.")
        if max_grad_norm > 0 and _clipping(opt) == 0.0:
            opt.gradient_clipping = max_grad_norm  # every rank: the same arguments
        if self.args.world_size > 1 and getattr(self.accelerator, "scaler", None) is not None:
            raise ValueError(
                "dsopt.hf.Trainer: fp16=True scales the loss with torch's GradScaler, which "
                "decides on each rank alone whether to skip a step; with dsopt's reduction the "
                "ranks would disagree. Use bf16=True on several ranks.")

    # ---- creation and wrapping -----------------------------------------------

    def create_optimizer(self, model=None):
        """transformers' ``create_optimizer``; a dsopt.torch class of
        ``optimizer_cls_and_kwargs`` gets ``gradient_clipping =
        max_grad_norm`` (when > 0) and runs on torch.distributed's default
        group (its ``comm=None``)."""
        saved = self.optimizer_cls_and_kwargs
        if self.optimizer is None and saved is not None and _is_dsopt_class(saved[0]) and \
                self._max_grad_norm() > 0:
            self.optimizer_cls_and_kwargs = (saved[0], _with_clipping(saved[1],
                                                                      self._max_grad_norm()))
        try:
            optimizer = super().create_optimizer(model)
        finally:
            self.optimizer_cls_and_kwargs = saved
        opt = dsopt_optimizer(optimizer)
        if opt is not None:
            self._check_dsopt_optimizer(opt)
        return optimizer

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        """transformers' preparation (wrapping, optimizer, scheduler,
        checkpoint loading); then, with a dsopt optimizer, DDP's reduction
        is replaced by ``dsopt.torch.ddp_comm_hook``."""
        model, train_dataloader = super()._prepare_for_training(
            max_steps, train_dataloader, resume_from_checkpoint)
        opt = self.dsopt_optimizer
        ddp = _find_ddp(model)
        if opt is not None and ddp is not None and not _has_dsopt_hook(ddp):
            if getattr(ddp, "_comm_hooks", None):
                raise ValueError(
                    "dsopt.hf.Trainer: the DistributedDataParallel model already has a "
                    "communication hook (accelerate's DistributedDataParallelKwargs comm_hook?); "
                    "dsopt reduces the gradients itself: remove it.")
            ddp.register_comm_hook(None, dsopt_torch.ddp_comm_hook)
        return model, train_dataloader

    # ---- clipping and the logged norm ----------------------------------------

    def _clip_grad_norm(self, model):
        """Nothing with a dsopt optimizer (it clips the averaged gradient in
        its step); transformers' clipping otherwise."""
        if self.dsopt_optimizer is not None:
            return None
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        """With a dsopt optimizer None here (the step has not run; the log
        takes dsopt's norm); transformers' norm otherwise."""
        if self.dsopt_optimizer is not None:
            return None
        return super()._get_grad_norm(model, grad_norm)

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, *args, **kwargs):
        """transformers' logging, saving and evaluation; with a dsopt
        optimizer the logged ``grad_norm`` is dsopt's last step's (when
        dsopt computed one: clipping or ``report_grad_norm``)."""
        opt = self.dsopt_optimizer
        if opt is not None:
            info = opt.last_step_info
            grad_norm = info.grad_norm if info is not None and info.grad_norm >= 0 else None
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    # ---- checkpoints ----------------------------------------------------------

    def _saving_ranks(self):
        """The ranks whose ``args.should_save`` is True (process 0, or each
        node's first process with ``save_on_each_node``)."""
        if not self.args.save_on_each_node or self.args.world_size == 1:
            return [0]
        flags = [None] * self.args.world_size
        torch.distributed.all_gather_object(flags, bool(self.args.should_save))
        return [rank for rank, flag in enumerate(flags) if flag]

    def _save_optimizer_and_scheduler(self, output_dir):
        """With a dsopt optimizer: ``optimizer.pt`` holds every rank's
        state (``state_dict_all_ranks``, called on every rank; the saving
        rank writes it) and ``scheduler.pt`` the scheduler's; otherwise
        transformers' saving."""
        opt = self.dsopt_optimizer
        if opt is None:
            return super()._save_optimizer_and_scheduler(output_dir)
        state_dict = None
        for rank in self._saving_ranks():
            gathered = opt.state_dict_all_ranks(dst=rank)
            if gathered is not None:
                state_dict = gathered
        if self.args.should_save:
            torch.save(state_dict, os.path.join(output_dir, OPTIMIZER_NAME))
            with warnings.catch_warnings(record=True) as caught_warnings:
                torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_NAME))
            reissue_pt_warnings(caught_warnings)
        return None


__all__ = ["Trainer", "dsopt_optimizer"]
