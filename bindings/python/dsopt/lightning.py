"""dsopt.lightning: ``DsoptStrategy``, the PyTorch Lightning strategy for
dsopt.torch optimizers (docs/frameworks/lightning.md)::

    import lightning
    import dsopt.torch
    from dsopt.lightning import DsoptStrategy

    class Model(lightning.LightningModule):
        ...
        def configure_optimizers(self):
            return dsopt.torch.AdamW(self.parameters(), lr=1e-3)

    trainer = lightning.Trainer(strategy=DsoptStrategy(), accelerator="cpu", devices=2)
    trainer.fit(Model(), train_dataloader)

A strategy in the way Lightning's DeepSpeed strategy is one: Lightning's
DDP strategy (its launchers, process group, distributed sampler and
collectives) without the DistributedDataParallel wrapper, because the
dsopt.torch optimizer averages the gradients itself inside ``step()``.

* Processes: as ``strategy="ddp"``: ``devices=N`` starts the other N-1
  processes by running the script again (``start_method="popen"``, the
  default), or the processes come from ``torchrun`` / the environment
  (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). The default
  process group is initialised before ``configure_optimizers`` runs (gloo
  on the CPU, NCCL with one GPU per process, ``cuda:LOCAL_RANK``;
  ``process_group_backend`` chooses), so the optimizer created there with
  no ``comm`` runs its collectives on it.
* The model is not wrapped: every rank's parameters and buffers are
  broadcast from rank 0 when the strategy sets it up, so the replicas
  start equal and stay equal through dsopt's steps. Buffers (BatchNorm's
  running statistics) stay each rank's own, as under the DeepSpeed
  strategy; ``Trainer(sync_batchnorm=True)`` synchronises BatchNorm.
* Optimizers: every optimizer of ``configure_optimizers`` must be a
  dsopt.torch optimizer on the default process group (all ranks): with a
  ``torch.optim`` optimizer nothing would average the gradients, so that
  is an error (use ``strategy="ddp"`` for it). Gradient accumulation
  (``accumulate_grad_batches``) works as under DDP: Lightning accumulates
  ``.grad`` and dsopt averages the sum at the step (with ``overlap=True``
  only ``accumulate_grad_batches=1``: the hooks hand over every backward's
  gradients, which Lightning has divided by the accumulation count).
* Clipping: ``Trainer(gradient_clip_val=...)`` becomes dsopt's clipping.
  Lightning would clip ``.grad`` before ``step()``, where each rank holds
  its own gradients, not their average; instead the optimizers get
  ``gradient_clipping = gradient_clip_val`` (``opt.gradient_clipping``) and
  dsopt clips the global norm of the averaged gradients inside ``step()``,
  while Lightning's own clipping of dsopt optimizers is skipped. An
  optimizer created with another ``gradient_clipping`` is an error (say
  which you mean), and so is ``gradient_clip_algorithm="value"`` (dsopt
  clips by norm). ``precision="16-mixed"`` is refused (torch's
  GradScaler skips ``step()`` on a rank whose own gradients overflowed,
  while the other ranks enter dsopt's collective step): use
  ``"bf16-mixed"``, ``"32-true"``, or dsopt's loss scaling (``fp16=True``).
* Checkpoints: ``optimizer_state`` returns ``state_dict_all_ranks(dst=0)``
  (collective), so the file Lightning writes from rank 0 holds every
  rank's dsopt state; restoring (``fit(ckpt_path=...)``) loads it on every
  rank with ``load_state_dict``: each rank's own state at the same world
  size (ZeRO shards, 1-bit compression errors), resharded or reset as
  ``load_state_dict_shards`` does at another.

``DsoptStrategy`` is built on the ``lightning`` package (on
``pytorch_lightning`` when only that is installed);
``PytorchLightningDsoptStrategy`` is the same strategy for
``pytorch_lightning.Trainer`` when both are installed. Lightning is
imported when one of them is first used; dsopt does not depend on it.
"""

import importlib

__all__ = ["DsoptStrategy", "PytorchLightningDsoptStrategy"]

# The Lightning packages each name is built on, the first importable one.
_PACKAGES = {"DsoptStrategy": ("lightning.pytorch", "pytorch_lightning"),
             "PytorchLightningDsoptStrategy": ("pytorch_lightning",)}


def __getattr__(name):
    if name not in _PACKAGES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = _strategy_class(_import_lightning(_PACKAGES[name]), name)
    globals()[name] = cls  # built once
    return cls


def _import_lightning(packages):
    for package in packages:
        try:
            return importlib.import_module(package)
        except ImportError:
            continue
    raise ImportError(f"dsopt.lightning needs PyTorch Lightning ({' or '.join(packages)}), which "
                      f"is not installed for this Python (pip install lightning); dsopt itself "
                      f"does not depend on it")


def _strategy_class(pl, qualname):
    """The strategy class on the Lightning package ``pl``
    (``lightning.pytorch`` or ``pytorch_lightning``)."""
    import dsopt.torch

    def module(name):
        return importlib.import_module(f"{pl.__name__}.{name}")

    DDPStrategy = pl.strategies.DDPStrategy
    LightningOptimizer = module("core.optimizer").LightningOptimizer
    MockOptimizer = module("core.optimizer")._MockOptimizer
    MixedPrecision = module("plugins.precision").MixedPrecision
    TrainerFn = module("trainer.states").TrainerFn
    MisconfigurationException = module("utilities.exceptions").MisconfigurationException
    is_overridden = module("utilities.model_helpers").is_overridden
    rank_zero_warn = module("utilities.rank_zero").rank_zero_warn
    sync_module_states = module("overrides.distributed")._sync_module_states

    class DsoptStrategy(DDPStrategy):
        """Lightning's DDP strategy without the DistributedDataParallel
        wrapper, for dsopt.torch optimizers, which average the gradients
        themselves (see the ``dsopt.lightning`` module doc).
        ``DsoptStrategy()`` takes its settings from the Trainer (``devices``,
        ``num_nodes``, ``accelerator``); ``process_group_backend`` (default:
        ``"nccl"`` for CUDA devices, else ``"gloo"``), ``timeout`` (the
        process group's; default Lightning's) and ``start_method``
        (``"popen"``: the script is run again for the other processes;
        ``"spawn"``, ``"fork"``, ``"forkserver"``: torch.multiprocessing) are
        those of Lightning's ``DDPStrategy``."""

        def __init__(self, accelerator=None, parallel_devices=None, cluster_environment=None,
                     checkpoint_io=None, precision_plugin=None, process_group_backend=None,
                     timeout=None, start_method="popen"):
            kwargs = {} if timeout is None else {"timeout": timeout}
            super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                             cluster_environment=cluster_environment,
                             checkpoint_io=checkpoint_io, precision_plugin=precision_plugin,
                             process_group_backend=process_group_backend,
                             start_method=start_method, **kwargs)

        def setup(self, trainer):
            """``DDPStrategy.setup`` with rank 0's parameters and buffers
            broadcast instead of the DDP wrapper; when fitting, the
            Trainer's settings and ``configure_optimizers``' optimizers are
            checked (the same on every rank, so every rank raises)."""
            self.accelerator.setup(trainer)
            fitting = trainer.state.fn == TrainerFn.FITTING
            if fitting:
                self._check_trainer(trainer)
                if self._layer_sync:
                    self.model = self._layer_sync.apply(self.model)
            self.model = self.precision_plugin.convert_module(self.model)
            self.model_to_device()
            sync_module_states(self.model)
            if fitting:
                self.setup_optimizers(trainer)
                self._check_optimizers(trainer)
                self._clip_in_dsopt(trainer)
            self.setup_precision_plugin()
            # Not moved by _optimizers_to_device: dsopt keeps its state in
            # its own memory, on the parameters' device.

        def _setup_model(self, model):
            """The model as it is: no DistributedDataParallel wrapper."""
            return model

        def _check_trainer(self, trainer):
            clip = trainer.gradient_clip_val
            algorithm = getattr(trainer.gradient_clip_algorithm, "value",
                                trainer.gradient_clip_algorithm)
            if clip is not None and clip > 0 and algorithm not in (None, "norm"):
                raise MisconfigurationException(
                    f"DsoptStrategy: Trainer(gradient_clip_algorithm={algorithm!r}): the "
                    f"dsopt.torch optimizer clips the global norm of the averaged gradients "
                    f"(gradient_clip_val becomes its gradient_clipping); use "
                    f"gradient_clip_algorithm='norm'.")
            plugin = self.precision_plugin
            if isinstance(plugin, MixedPrecision) and getattr(plugin, "scaler", None) is not None:
                raise MisconfigurationException(
                    f"DsoptStrategy: precision={plugin.precision!r} scales the loss with torch's "
                    f"GradScaler, which skips optimizer.step() on a rank whose own gradients "
                    f"overflowed while the other ranks enter dsopt's collective step. Use "
                    f"precision='bf16-mixed' or '32-true', or dsopt's loss scaling (fp16=True "
                    f"on the optimizer, the loss multiplied by optimizer.loss_scale).")
            if is_overridden("configure_gradient_clipping", self.lightning_module,
                             pl.LightningModule):
                rank_zero_warn(
                    "DsoptStrategy: LightningModule.configure_gradient_clipping is overridden; "
                    "it sees each rank's own gradients (the dsopt.torch optimizer averages them "
                    "inside step()). Clip with the optimizer's gradient_clipping instead.")

        def _check_optimizers(self, trainer):
            for i, optimizer in enumerate(self.optimizers):
                if isinstance(optimizer, MockOptimizer):
                    continue  # configure_optimizers returned None: nothing steps
                name = f"configure_optimizers' optimizer {i} ({type(optimizer).__name__})"
                if not isinstance(optimizer, dsopt.torch.Optimizer):
                    raise MisconfigurationException(
                        f"DsoptStrategy: {name} is not a dsopt.torch optimizer: under "
                        f"DsoptStrategy nothing else averages the gradients across ranks. Use a "
                        f"dsopt.torch optimizer (dsopt.torch.AdamW, ...) or strategy='ddp'.")
                comm = optimizer.dsopt.communicator
                size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
                if (size, rank) != (self.world_size, self.global_rank):
                    raise MisconfigurationException(
                        f"DsoptStrategy: {name} is rank {rank} of {size} process(es), this process "
                        f"is rank {self.global_rank} of {self.world_size}: create it without comm= "
                        f"(torch.distributed's default process group).")
                if optimizer.overlap and trainer.accumulate_grad_batches > 1:
                    raise MisconfigurationException(
                        f"DsoptStrategy: {name} has overlap=True and the Trainer "
                        f"accumulate_grad_batches={trainer.accumulate_grad_batches}: the hooks "
                        f"hand every backward's gradients to dsopt, which Lightning has divided "
                        f"by the accumulation count. Use overlap=False with "
                        f"accumulate_grad_batches.")

        def _clip_in_dsopt(self, trainer):
            """gradient_clip_val becomes the dsopt optimizers' clipping (on
            every rank: the same settings), and the precision plugin's
            clipping leaves dsopt optimizers alone (it would clip each
            rank's own ``.grad``), as DeepSpeed's precision plugin leaves
            clipping to DeepSpeed."""
            clip = float(trainer.gradient_clip_val or 0)
            if clip <= 0:
                return
            optimizers = [o for o in self.optimizers if isinstance(o, dsopt.torch.Optimizer)]
            for i, optimizer in enumerate(optimizers):
                if optimizer.gradient_clipping not in (0.0, clip):
                    raise MisconfigurationException(
                        f"DsoptStrategy: Trainer(gradient_clip_val={clip:g}) but the dsopt.torch "
                        f"optimizer {i} clips at gradient_clipping="
                        f"{optimizer.gradient_clipping:g}: say which you mean (drop one of them, "
                        f"or make them equal).")
            for optimizer in optimizers:
                optimizer.gradient_clipping = clip
            plugin = self.precision_plugin
            if getattr(plugin, "_dsopt_clips", False):
                return
            lightning_clip = plugin.clip_gradients

            def clip_gradients(optimizer, clip_val=0.0, gradient_clip_algorithm=None):
                inner = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer
                if isinstance(inner, dsopt.torch.Optimizer):
                    return  # dsopt clips the averaged gradients inside step()
                if gradient_clip_algorithm is None:
                    return lightning_clip(optimizer, clip_val)
                return lightning_clip(optimizer, clip_val, gradient_clip_algorithm)

            plugin.clip_gradients = clip_gradients
            plugin._dsopt_clips = True

        def optimizer_state(self, optimizer):
            """The optimizer's state dict for the checkpoint: for a
            dsopt.torch optimizer ``state_dict_all_ranks(dst=0)``, every
            rank's dsopt state on rank 0, which saves the file (collective:
            Lightning calls it on every rank; the other ranks get ``{}``)."""
            if isinstance(optimizer, LightningOptimizer):
                optimizer = optimizer._optimizer
            if isinstance(optimizer, dsopt.torch.Optimizer):
                state = optimizer.state_dict_all_ranks(dst=0)
                return {} if state is None else state
            return super().optimizer_state(optimizer)

        def load_optimizer_state_dict(self, checkpoint):
            """Restores every optimizer on every rank from the checkpoint's
            state dicts (collective for dsopt.torch optimizers: each rank
            takes its own dsopt state at the saved world size, and reshards
            or resets at another; see ``load_state_dict``)."""
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
                optimizer.load_state_dict(state)

        def teardown(self):
            """``DDPStrategy.teardown`` without moving the optimizers'
            state to the CPU (dsopt keeps its state in its own memory; the
            optimizers stay usable, and open: ``close()`` them on every rank
            when done)."""
            optimizers, self._optimizers = self._optimizers, []
            try:
                super().teardown()
            finally:
                self._optimizers = optimizers

    DsoptStrategy.__qualname__ = qualname
    DsoptStrategy.__module__ = __name__
    return DsoptStrategy
