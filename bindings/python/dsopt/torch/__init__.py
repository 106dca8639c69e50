"""dsopt.torch: ``torch.optim`` optimizers that run dsopt.

Drop-in replacements for ``torch.optim.Adam`` / ``AdamW`` (same
signatures, defaults and groups), the 1-bit optimizers with torch-style
arguments, and the config-dict ``Optimizer`` they all are::

    import dsopt.torch
    opt = dsopt.torch.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    # dsopt.torch.Adam, Lamb, OneBitAdam(..., freeze_step=1000), OneBitLamb,
    # ZeroOneAdam; or dsopt.torch.Optimizer(params, config_dict)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=1000)
    for batch in data:
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        opt.step()
        sched.step()

What behaves as in torch.optim:

* Groups: dicts with ``"params"`` and the algorithm's hyperparameters as
  dsopt lists them (``dsopt.group_params``: ``lr``, ``betas``, ``eps``,
  ``weight_decay``; Lion without ``eps``), and ``non_freeze`` for 1-bit
  Adam; every group carries those and torch's flags (``amsgrad``,
  ``maximize``, ``foreach``, ``capturable``, ``differentiable``,
  ``fused``; ``decoupled_weight_decay`` where torch's Adam has it). Before
  each step every group's hyperparameters that changed are handed to dsopt, so LR and
  momentum schedules (``OneCycleLR``/``CyclicLR`` with
  ``cycle_momentum``) work; invalid values raise ValueError as in torch.
  ``add_param_group`` works after creation (see there for what is carried
  over). A group key dsopt does not know (``momentum``) is an error.
* ``.grad`` None: no gradient for that parameter (dsopt gets an absent,
  NULL-data gradient): with an algorithm whose parameters count their own
  steps (``dsopt.describe(type).param_steps``: Adam, AdamW, Lion, SGD) the
  parameter, its moments and its step count stay as they are, as torch.optim does: frozen parameters
  (``requires_grad=False``, from the start or frozen and unfrozen
  mid-run) and unused branches are left exactly as torch leaves them,
  and each parameter's bias correction uses its own step count, as
  torch's (dsopt's fp32 Adam itself matches torch's within rounding,
  not bit for bit). On several ranks a parameter with a gradient on some ranks
  only gets zeros from the others. The 1-bit optimizers step every
  parameter at every step, an absent gradient as zeros.
  ``zero_grad(set_to_none=False)`` leaves zero gradients, which do update
  the parameters (as in torch). ``step(closure)`` works.
* ``optimizer.state[p]`` is a live view of dsopt's state (see
  ``_live_state``): for a parameter that has been updated, ``"step"`` (a
  0-d tensor, a copy: float32, float64 under a float64 default dtype, as
  in torch) and fp32 tensors on dsopt's own memory, shaped like the
  parameter: ``"exp_avg"``, ``"exp_avg_sq"``,
  ``"master"`` (the fp32 masters of 16-bit parameters), the 1-bit
  optimizers' ``"worker_error"`` (from their compression stage on, at
  several ranks) and 1-bit LAMB's ``"exp_avg_sq_fresh"``. dsopt's moments
  are fp32 whatever the parameter's dtype (torch keeps them in the
  parameter's). Under ZeRO stage 1/2 they are flat tensors of
  this rank's part of the parameter, starting at element ``"offset"``.
  In-place writes to them (between steps) change dsopt's state; parameters
  never updated have no entry. A view belongs to the dsopt optimizer it
  was made on: after ``add_param_group`` (which makes a new one) read
  ``opt.state[p]`` again (an old view keeps the old optimizer's memory in
  one process, and is freed memory on several ranks, as after
  ``close()``).
* ``copy.deepcopy(opt)`` is a new optimizer over deep copies of the
  parameters with the same state (one process).
* Parameters moved or cast after the optimizer was made (``model.to(...)``,
  ``p.data = ...``) are followed. dsopt updates each parameter in place
  through the storage it was given, so before every step (and before
  ``state_dict``, ``load_state_dict``, ``torch_state_dict``, ``deepcopy``,
  pickling and ``add_param_group``) the optimizer compares every
  parameter's ``data_ptr()`` with dsopt's (about what reading their
  ``.grad`` costs) and follows what changed. It keeps the storage dsopt
  has referenced, so that no other tensor can take that address unseen:
  the storage a parameter left stays allocated until the optimizer
  follows it (the next step).

  - new storage of the same dtype and device (``model.to(torch.device(
    "cpu", 0))``, which copies every parameter; ``p.data = p.data.clone()``;
    ``.to(float64).to(float32)``): dsopt takes it, and the run goes on bit
    for bit;
  - another device (a model built on the CPU and moved to ``cuda:0``):
    dsopt's optimizer is rebuilt there (``"device"``) with its whole state;
  - another dtype (``model.to(torch.bfloat16)``): rebuilt with every
    parameter's moments and step count; a parameter that became 16-bit
    gets fp32 masters from its current values, one that became fp32 goes
    on from its values, as with torch.optim (which keeps no masters). The
    global step count (``last_step_info.step``) and the fp16 loss scale
    restart, as after ``add_param_group``.

  Before the first step any change just starts over from the parameters
  as they are. A rebuild is collective: every rank moves or casts its
  model alike (as frameworks do); on several ranks ``state_dict()`` and
  ``torch_state_dict()`` between a cast and the next step raise
  RuntimeError. Read ``opt.state[p]`` again after a rebuild. What cannot
  be followed raises RuntimeError naming the parameter, before anything is
  written (storage a model left is never written): a 1-bit optimizer cast
  after its first step (its compressed state spans all parameters: cast
  the model before creating the optimizer), a parameter that became
  float64 or non-contiguous, has another size once it has state, or is
  on another device than the others; with ``overlap=True``, a model moved
  between backward and ``step()``. Once fixed, the run goes on.
* ``state_dict()`` is torch's (the groups' settings, ``"state"`` empty)
  plus this rank's dsopt state blob under ``"dsopt_state"``;
  ``load_state_dict`` restores both and hands the groups' hyperparameters
  to dsopt. Where parameters count their own steps, ``load_state_dict``
  also takes a torch.optim state dict (``torch.optim.Adam``/``AdamW``/
  ``SGD``: the moments by their names, and steps, written into dsopt),
  and ``torch_state_dict()`` returns one that torch's optimizer loads: a
  run moves between torch.optim and dsopt both ways.

What differs from torch.optim:

* ``amsgrad``, ``maximize``, ``capturable``, ``differentiable`` must be
  False (ValueError); ``foreach`` and ``fused`` are accepted and ignored
  (dsopt always runs one fused step). Sparse gradients are rejected.
* Parameters: contiguous float32 / float16 / bfloat16 tensors, all on the
  CPU or all on CUDA, updated in place through ``data_ptr()``; dsopt keeps
  fp32 moments (and fp32 masters for 16-bit parameters) in its own memory.
* ``step`` is collective over ``comm`` (see below): with several ranks
  every rank steps with its local gradients and dsopt averages them.
  ``self.last_step_info`` is the last ``dsopt.StepInfo``; ``loss_scale``
  the fp16 loss scale; ``dsopt`` the underlying ``dsopt.Optimizer``;
  ``close()`` destroys it (collective).
* Skipped steps (Inf/NaN gradients on some rank) warn
  ``dsopt.SkippedStepWarning`` (rate-limited); when the run stops
  progressing ``step`` raises ``dsopt.NonFiniteError`` (its ``.info`` is
  also ``last_step_info``), as ``dsopt.Optimizer.step`` does. A gradient
  norm that stays far above its recent history (every value finite) warns
  ``dsopt.DivergenceWarning`` once per episode
  (``last_step_info.diverging``).
* Pickled (``torch.save(opt)``) and unpickled, an optimizer is a new one
  over the unpickled parameters on a communicator of its own, as
  ``copy.deepcopy`` makes; checkpoint with ``state_dict()``.
* ``torch.compile``: ``step()`` and ``zero_grad()`` run eagerly (a graph
  break; torch >= 2.1), so ``torch.compile(opt.step)`` and a compiled
  training step that calls ``opt.step()`` work and give the eager
  results; torch.optim's step is compiled into the graph instead.
* ``add_param_group`` rebuilds dsopt's optimizer (collective): the old
  parameters' state, steps and hyperparameters carry over exactly, but
  the fp16 loss scale restarts (dsopt has no setter for it), as do dsopt's
  global step count and momentum masks; the 1-bit optimizers take new
  groups only before their first step, ZeRO on several ranks only before
  any parameter has state.
* ZeRO (``zero_stage=1 or 2``, or ``"zero_optimization"`` in a config;
  Adam and AdamW): every rank keeps the optimizer state of its shard only,
  so each rank saves its own ``state_dict()``. ``load_state_dict`` takes
  this rank's own state dict back at the same world size;
  ``load_state_dict_shards(state_dicts)`` takes the state dicts of all
  ranks of the saved run, in rank order, and continues it at any world size
  and ZeRO stage (stage 0 -> 2, 2 ranks -> 4, ...; collective, every rank
  passes all of them). ``memory_usage()`` is the bytes dsopt holds here.
* FSDP2 (``torch.distributed.fsdp.fully_shard``; docs/guides/fsdp2.md):
  the parameters of a fully_shard'ed model (DTensors, rows of every tensor
  on each rank) are taken as they are; dsopt updates the local shards in
  one step per group and reduces what whole tensors decide (clipping norm,
  non-finite check, LAMB's trust ratios) over the shard group. ``comm``
  then names the replicas of HSDP (None: taken from the parameters' 2-D
  root mesh, if any), over which dsopt averages and the 1-bit optimizers
  exchange; ``state_dict()`` is torch.optim's layout with DTensors, for
  torch.distributed.checkpoint (resume bit for bit, reshard to another
  world size). ZeRO, overlap, the 1-bit optimizers without replicas and
  rebuilding the optimizer (``add_param_group`` after creation, casts,
  copies) are refused with the reason (``_dtensor``).

``Optimizer(params, config, comm=None, *, overlap=False)`` takes a dsopt
config dict (docs/reference/config.md "Configuration") without ``param_groups``: each torch
group becomes one dsopt group. Without a ``"device"`` key the optimizer
runs on the parameters' device (``"cuda"`` for CUDA tensors), as the
classes do.

* ``comm``: a ``dsopt.Communicator``, an mpi4py communicator, a
  torch.distributed ``ProcessGroup``, or None. None means
  torch.distributed's default group when torch.distributed is initialised
  (``init_process_group``, as under ``torchrun``), else one process. A
  process group (given, or the default one) becomes
  ``dsopt.Communicator.from_torch(group)``, which this optimizer owns and
  closes: dsopt's collectives then run as torch.distributed collectives on
  that group (gloo: host memory; NCCL: CUDA memory, on torch's current
  stream at creation), with the group's timeout. On host memory dsopt sums
  floats itself in a fixed order, so the results are bit-identical to an
  MPI run of the same training. To keep a torch.distributed job's ranks
  independent pass ``comm=dsopt.Communicator.local()``.
* ``overlap=True`` (torch >= 2.1): a hook on every parameter
  (``register_post_accumulate_grad_hook``) hands its gradient to dsopt
  (``dsopt_grad_ready``) as soon as backward has produced it, so that the
  gradient reduction overlaps the rest of backward; ``step()`` completes
  the step. The hook then sets ``p.grad = None``: after backward ``.grad``
  is None, so code must not read or change ``.grad`` (clip with dsopt's
  ``gradient_clipping``). With ``gradient_accumulation_steps`` = G, run G
  backward passes per ``step()``, each on its own micro-batch's loss (not
  divided by G): dsopt sums the G gradients and uses their mean. A
  parameter that gets no gradient in a backward pass contributes zeros to
  that micro-batch; one that gets none in the whole step is absent, as
  ``.grad`` None is without overlap. A parameter frozen when the hooks are
  made gets its ``.grad`` handed over by ``step()`` and its hook once it
  requires gradients. A ``.grad`` that no hook saw (assigned, or from
  ``torch.autograd.grad``) is handed over by ``step()``, as overlap=False
  steps with it. Parameters moved or cast between steps are followed
  at the first hand-over of a step (new storage), or by ``step()``, to
  which the hooks then leave ``.grad`` for that step (another dtype or
  device). With torch < 2.1 the constructor warns and
  ``step()`` hands ``.grad`` over instead, then sets it to None (same
  results, no overlap). ``close()`` removes the hooks.
* ``overlap=True`` under ZeRO stage 1/2 (any torch) also defers the
  parameter allgather (``"deferred_allgather"``, buckets of 2^22 elements
  unless the config sets ``allgather_bucket_size``): ``step()`` returns
  once the update is done, with the buckets' gathers in flight on dsopt's
  thread (mpi4py's MPI_THREAD_MULTIPLE, or
  ``comm=dsopt.Communicator.from_torch(group, concurrent=True)`` where no
  other thread issues collectives on that group; elsewhere they finish
  inside ``step()``), and a global forward pre-hook makes each module wait for
  its own parameters' bucket before it runs, so the first layers start
  while the last buckets arrive. The buckets arrive in the model's forward
  order: the pre-hook records the order in which the forward before the
  first step reaches the parameters (those it never reaches go last, in
  parameter order; again after a rebuild), and the first step hands it to
  dsopt (``dsopt_gather_order``, collective: just before the step's first
  gradient is handed over, or in ``step()``), so a model whose modules
  are registered in another order than they run still gets its first
  layers' buckets first. Ranks whose forward orders differ keep parameter
  order, with a ``RuntimeWarning``. ``opt.state``, ``state_dict()``, the next
  step, ``close()`` and ``model.state_dict()`` (of the modules that have
  run) wait for every bucket; ``opt.wait_gathers()`` before reading
  parameters any other way (a parameter used outside its own module's
  forward, ``model.to(...)`` between a step and the next forward). Results
  are bit-identical (``tests/python/test_torch_prefetch.py``).
* Gradient descriptors (``overlap=False``): ``step()`` keeps the
  ``dsopt_tensor`` descriptors of the last step's gradients and describes a
  parameter's ``.grad`` again only when it is another tensor object than
  at the last step (autograd accumulating into an existing ``.grad``, or
  ``zero_grad(set_to_none=False)``, keeps the object; ``set_to_none=True``
  makes new ones, which are described again). A ``.grad`` that stays the
  same object must keep its storage: after swapping it in place
  (``p.grad.set_(...)``, ``p.grad.data = ...``, ``p.grad.resize_(...)``)
  call ``clear_grad_cache()`` before the next ``step()``; ``model.to(...)``,
  which moves ``.grad`` along with the parameters, needs none (the
  parameters' new storage drops the kept descriptors). Only weak
  references to the gradients are kept, so a dropped ``.grad`` is freed
  as before.
"""

import torch as _torch

from . import _classes
from ._classes import *  # noqa: F401,F403 -- every optimizer class, as _classes.__all__ lists them
from ._ddp import ddp_comm_hook
from ._optimizer import Optimizer

__all__ = [*_classes.__all__, "Optimizer", "ddp_comm_hook"]


def __getattr__(name):
    """``dsopt.torch.Adagrad`` and other names that do not exist: an
    AttributeError that says what does."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    hint = ""
    if hasattr(_torch.optim, name):
        hint = f" (torch.optim.{name} has no dsopt implementation)"
    raise AttributeError(
        f"module {__name__!r} has no attribute {name!r}{hint}; dsopt.torch has "
        f"{', '.join(__all__)}")
