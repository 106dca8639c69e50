"""dsopt.Optimizer: one dsopt optimizer handle over caller-owned arrays."""

import contextlib
import json
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import config as _config
from ._lib import ffi, lib
from ._device_array import CudaBuffer
from .communicator import Communicator
from ._args import as_float, as_int32, as_int64
from .errors import DoubleReductionWarning, InvalidArgumentType, Mismatch, NonFiniteError, check
from .tensors import GradDescriptors, TensorList, describe


@dataclass(frozen=True)
class StepInfo:
    """What one step did (the C ``dsopt_step_info``)."""

    skipped: bool      # the step was skipped (non-finite gradient on some rank)
    compressed: bool   # the step used 1-bit compressed communication
    step: int          # updates applied so far, this one included
    loss_scale: float  # scale for the next backward (1.0 without loss scaling)
    grad_norm: float   # global gradient norm before clipping; -1.0 without clipping / report_grad_norm
    bytes_sent: int    # bytes this rank sent during the step
    consecutive_skips: int  # steps skipped in a row, this one included; 0 when it applied
    phase: int = 0     # what the step did: dsopt.PHASE_SKIPPED/FULL/COMPRESSED/LOCAL/SYNC
    # every rank's gradients were bit-identical (checked while the run has
    # applied fewer than 3 steps): something else (DistributedDataParallel)
    # had averaged them already
    grads_replicated: bool = False
    # the global gradient norm has stayed far above its own recent history
    # (every value finite): 1 on every step of such an episode
    # ("divergence_check" in the config; docs/reference/c-api.md "Divergence that stays finite")
    diverging: bool = False
    # the part of bytes_sent sent to ranks of other nodes ("topology" in the
    # config; docs/reference/c-api.md "Step info")
    bytes_inter_node: int = 0

    @classmethod
    def _from_c(cls, info) -> "StepInfo":
        return cls(
            skipped=bool(info.skipped),
            compressed=bool(info.compressed),
            step=int(info.step),
            loss_scale=float(info.loss_scale),
            grad_norm=float(info.grad_norm),
            bytes_sent=int(info.bytes_sent),
            consecutive_skips=int(info.consecutive_skips),
            phase=int(info.phase),
            grads_replicated=bool(info.grads_replicated),
            diverging=bool(info.diverging),
            bytes_inter_node=int(info.bytes_inter_node),
        )


class StateView(NamedTuple):
    """Part of one parameter's optimizer state in dsopt's own memory
    (``Optimizer.state_view``): ``data`` holds elements ``offset ..
    offset + len(data) - 1`` of the parameter (flattened, fp32);
    ``param_numel`` is the parameter's numel. ``data`` is a numpy float32
    array on host memory, or a ``dsopt.CudaBuffer``
    (``__cuda_array_interface__``) on device memory (``on_device``)."""

    data: object
    offset: int
    param_numel: int
    on_device: bool


class _HostView:
    """``__array_interface__`` of a host view: the numpy array made from it
    keeps this object, and through it the optimizer, referenced."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, address, numel, owner):
        self.__array_interface__ = {"shape": (numel,), "typestr": "<f4",
                                    "data": (address, False), "version": 3}
        self.owner = owner


class _DeviceView(CudaBuffer):
    """A device state view: a ``CudaBuffer`` that keeps the optimizer
    referenced (as ``_HostView`` does for numpy arrays)."""

    __slots__ = ("owner",)

    def __init__(self, address, numel, owner):
        super().__init__(address, numel, np.dtype(np.float32), False, None)
        self.owner = owner


class SkippedStepWarning(RuntimeWarning):
    """A step was skipped because some rank's gradients had Inf/NaN.

    ``Optimizer.step`` warns on the first skipped step of an optimizer, then
    again only when a run of consecutive skips reaches 10, 100, 1000, ...
    steps, so the occasional overflow of fp16 loss scaling does not flood the
    log. Every rank warns alike. A step that raises ``NonFiniteError`` does
    not warn (the exception reports it)."""


class DivergenceWarning(RuntimeWarning):
    """The run's global gradient norm has stayed far above its own recent
    history while every value is finite (``StepInfo.diverging``): a
    divergence that skips no step. ``Optimizer.step`` (and the
    ``dsopt.torch`` optimizers) warn once per episode, on its first step;
    every rank warns alike. The rule and its config key
    ``"divergence_check"`` are in the docs/reference/c-api.md ("Divergence that stays
    finite")."""


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _param_name(name) -> bytes:
    if not isinstance(name, str):
        raise InvalidArgumentType(f"name must be a str, got {type(name).__name__}")
    return name.encode("utf-8")


def _is_power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


class Optimizer:
    """``Optimizer(config, params, comm=None, groups=None)``

    ``config``: dict or JSON text (docs/reference/config.md). ``params``: list of
    C-contiguous, writable arrays (numpy float32 / float16, bf16 as
    ``dsopt.bf16(uint16 array)`` or ``(uint16 array, "bfloat16")``), updated
    in place by ``step``. ``comm``: a ``dsopt.Communicator``; None creates a
    local one owned by this optimizer. ``groups``: see ``dsopt.config``.

    Create, step, load_state_dict and close are collective over ``comm``.
    The optimizer keeps the arrays and the communicator referenced for as
    long as it exists. Multi-rank code must call ``close()`` (or use
    ``with``) on every rank before MPI is finalised: the garbage collector
    destroys only optimizers on a local communicator.
    """

    def __init__(self, config, params, comm=None, *, groups=None):
        self._handle = None
        self._group_param_names = None  # group_param_names, asked once
        params = list(params)
        config_text, group_indices = _config.resolve(config, groups, len(params))
        self._params = TensorList(params, writable=True, kind="params", groups=group_indices)
        self._param_groups = group_indices
        self._owns_comm = comm is None
        if comm is None:
            comm = Communicator.local()
        elif not isinstance(comm, Communicator):
            raise InvalidArgumentType(f"comm must be a dsopt.Communicator, got {type(comm).__name__}")
        comm._acquire(self)
        self._comm = comm
        out = ffi.new("dsopt_optimizer **")
        try:
            check(lib.dsopt_create(out, config_text.encode("utf-8"), comm.handle,
                                   self._params.c_array, len(self._params)))
        except BaseException:
            self._release_comm()
            raise
        self._handle = out[0]
        self._info = ffi.new("dsopt_step_info *")
        self._grad = ffi.new("dsopt_tensor *")  # grad_ready's descriptor, reused
        self._grads = GradDescriptors(len(self._params))  # step's, see step()
        self._skip_reported = False
        self._double_reduction_reported = False
        self._diverging = False  # the last step's info.diverging: warn when it turns on

    # ---- life cycle ------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def communicator(self) -> Communicator:
        return self._comm

    @property
    def params(self) -> list:
        """The parameter objects given at creation or to the last
        ``rebind_params`` (updated in place). With ``"deferred_allgather"``
        a step returns before they are whole: ``wait_gather()`` first."""
        return list(self._params.objects)

    def rebind_params(self, params) -> None:
        """Points the optimizer at new storage for its parameters
        (``dsopt_rebind_params``): ``params`` holds every parameter again,
        in order, as the constructor takes them, with the same numel, dtype
        and group, on the optimizer's device. Nothing else changes: the next
        step updates the new arrays in place (fp32 masters of 16-bit
        parameters stay dsopt's), so a run whose values were copied into new
        arrays continues bit-identically. The optimizer then references the
        new arrays instead of the old ones. Not collective. Raises
        ``InvalidArgument`` (nothing changes) for another count, numel,
        dtype, group or device, or while gradients are handed over."""
        handle = self._live()
        params = TensorList(list(params), writable=True, kind="params", groups=self._param_groups)
        check(lib.dsopt_rebind_params(handle, params.c_array, len(params)))
        self._params = params

    @property
    def handle(self):
        """The ``dsopt_optimizer *`` (cffi pointer), for calls the class does not wrap."""
        return self._live()

    def _live(self):
        if self._handle is None:
            raise ValueError("dsopt.Optimizer is closed")
        return self._handle

    def _release_comm(self) -> None:
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is None:
            return
        comm._release(self)
        if self._owns_comm:
            comm.close()

    def close(self) -> None:
        """Destroys the optimizer (collective); idempotent."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.dsopt_destroy(handle)
        grads = getattr(self, "_grads", None)
        if grads is not None:
            grads.clear()
        self._release_comm()

    def __enter__(self) -> "Optimizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is None:
            return
        comm = getattr(self, "_comm", None)
        if comm is not None and comm.kind == "local":
            self.close()
        else:
            # Destroy is collective and MPI may be finalised by now: leak instead.
            warnings.warn("unclosed multi-rank dsopt.Optimizer; call close() on every rank",
                          ResourceWarning)

    # ---- stepping --------------------------------------------------------

    def step(self, grads=None) -> StepInfo:
        """One optimizer step with this rank's local gradients, one per
        parameter, in parameter order (read only, during the call).
        ``grads=None`` completes a step whose gradients were handed over
        with ``grad_ready`` (``dsopt_step(opt, NULL, 0, info)``); passing
        gradients while some are handed over raises ``InvalidArgument``.
        An entry ``None`` says "no gradient for this parameter on this rank
        in this step" (a NULL-data descriptor): absent on some ranks, those
        contribute zeros; absent on every rank, Adam/AdamW leave the
        parameter, its moments and its step count (``param_step``) as they
        are (torch.optim's ``.grad is None``), while LAMB and the 1-bit
        optimizers step with a zero gradient.

        Gradient objects are described (data pointer, numel, dtype, checks)
        only when they are new: the optimizer keeps the last step's
        descriptors and gradient objects, and a gradient that ``is`` the
        object at its place in the previous step is not looked at again, so
        stepping with the same arrays every step (filled in place) costs no
        Python work per gradient. Such an object must therefore still
        describe the same memory: a numpy array's buffer cannot move while
        the optimizer references it (``resize`` refuses), but a torch
        tensor whose storage is swapped in place (``set_``, ``.data =``,
        ``resize_``) or an array whose ``dtype``/``strides`` are assigned,
        or a ``dsopt.bf16`` whose ``.array`` is replaced, must be passed as
        a new object, or ``clear_grad_cache()`` called first. The last
        step's gradient objects stay referenced until they are replaced,
        ``clear_grad_cache()`` or ``close()``.

        A step with Inf/NaN gradients on some rank is skipped on every rank
        (``info.skipped``) and warns ``SkippedStepWarning`` (rate-limited,
        see there). When the run stops progressing (``max_consecutive_skips``
        skips in a row, or an fp16 overflow at ``min_loss_scale``) the
        skipped step raises ``NonFiniteError`` with its ``StepInfo`` as
        ``.info``; the next step may continue.

        A gradient this binding cannot describe on one rank fails the step
        on every rank (that rank raises its own error, the others
        ``InvalidArgument`` naming it); nothing changes. A ``CommError``
        from a collective inside the update (ZeRO's parameter allgather,
        the 1-bit optimizers' compressed exchange) marks the optimizer
        failed: later steps, ``grad_ready``, ``state_dict`` and state views
        raise ``CommError`` saying the state is inconsistent; create a new
        communicator and optimizer on every rank and load the last saved
        state (docs/robustness.md "A failed collective")."""
        handle = self._live()
        if grads is None:
            return self._step_with(handle, ffi.NULL, 0, 4)
        grads = list(grads)
        cache = self._grads
        with self._failing_everywhere(handle):
            if len(grads) == cache.num:
                cache.update(grads)
                c_array, num = cache.c_array, cache.num
            else:  # a count dsopt rejects: described as always, the cache left alone
                grad_list = TensorList(grads, writable=False, kind="grads", allow_none=True)
                c_array, num = grad_list.c_array, len(grad_list)
        return self._step_with(handle, c_array, num, 4)

    @contextlib.contextmanager
    def _failing_everywhere(self, handle):
        """Around the description of a step's gradients: when it raises, the
        step still makes its collective call, with gradients dsopt rejects
        (NULL, -1), so that every rank's step fails together (the others
        with ``Mismatch`` naming this rank) instead of waiting for
        this one; then this rank raises its own error. Nothing changes."""
        try:
            yield
        except Exception:
            c_info = self._info
            c_info.struct_size = ffi.sizeof("dsopt_step_info")
            lib.dsopt_step(handle, ffi.NULL, -1, c_info)
            raise

    def clear_grad_cache(self) -> None:
        """Forgets the gradient descriptors kept from the last ``step`` and
        drops the references to its gradient objects: the next step
        describes every gradient afresh (see ``step``). Not collective."""
        self._grads.clear()

    def _step_with(self, handle, c_grads, num_grads, stacklevel) -> StepInfo:
        """``dsopt_step`` with a ``dsopt_tensor[]`` (or NULL, 0) and what
        ``step`` makes of its result; ``stacklevel`` of the skip warning
        counts from ``_warn_skipped``."""
        c_info = self._info
        c_info.struct_size = ffi.sizeof("dsopt_step_info")
        rc = lib.dsopt_step(handle, c_grads, num_grads, c_info)
        info = StepInfo._from_c(c_info)  # written on DSOPT_OK and DSOPT_ENONFINITE
        try:
            check(rc)
        except NonFiniteError as error:
            error.info = info
            self._skip_reported = True
            self._diverging = info.diverging
            raise
        if info.diverging and not self._diverging:
            self._warn_diverging(info, stacklevel)
        self._diverging = info.diverging
        if info.skipped:
            self._warn_skipped(info, stacklevel)
        if info.grads_replicated and not self._double_reduction_reported:
            self._warn_double_reduction(stacklevel)
        return info

    def grad_ready(self, index, grad) -> None:
        """Hands over parameter ``index``'s local gradient of one micro-batch
        (``dsopt_grad_ready``), typically from a backward hook, so that its
        reduction overlaps the rest of backward; ``step()`` (no gradients)
        then completes the step on every rank.

        ``grad``: an array as ``step`` takes one (C-contiguous numpy float32
        / float16, bf16 as ``dsopt.bf16(bits)`` or ``(bits, "bfloat16")``,
        or a torch tensor on the parameters' device) with the parameter's
        numel. It is read completely before the call returns, so the buffer
        may be reused at once. Any order, which may differ between ranks.
        With ``"gradient_accumulation_steps"`` = G each parameter is handed
        over G times per step (once per micro-batch) and the step uses the
        mean of the G gradients; a parameter not handed over in a
        micro-batch contributes zeros. Not collective (``step`` is).

        Raises ``InvalidArgument`` (nothing changes) for an index out of
        range, a numel or dtype that does not fit, or a parameter already
        handed over G times in this step; ``InvalidArgumentType`` for an
        array the binding does not take."""
        handle = self._live()
        if type(index) is not int or not _INT64_MIN <= index <= _INT64_MAX:
            index = as_int64(index, "index")
        buf = describe(grad, writable=False, what="grad")
        tensor = self._grad
        tensor.data = ffi.cast("void *", buf.address)
        tensor.numel = buf.numel
        tensor.dtype = buf.dtype
        rc = lib.dsopt_grad_ready(handle, index, tensor)
        if rc:
            check(rc)

    def _warn_skipped(self, info: StepInfo, stacklevel: int) -> None:
        """Warns on the first skip, then when a run reaches 10, 100, ... skips."""
        run = info.consecutive_skips
        if self._skip_reported and not (run >= 10 and _is_power_of_ten(run)):
            return
        self._skip_reported = True
        warnings.warn(
            f"dsopt: step skipped because some rank's gradients had Inf/NaN ({run} skipped "
            f"in a row). After \"max_consecutive_skips\" skips in a row (config key, "
            f"default 50; 0 turns it off) step() raises dsopt.NonFiniteError. Further "
            f"skips warn only when a run reaches 10, 100, 1000, ... steps.",
            SkippedStepWarning, stacklevel=stacklevel)

    def _warn_diverging(self, info: StepInfo, stacklevel: int) -> None:
        """Warns on the first step of a divergence episode."""
        norm = f" (global gradient norm {info.grad_norm:.3g})" if info.grad_norm >= 0 else ""
        warnings.warn(
            f"dsopt: the run is diverging at step {info.step}: the global gradient norm{norm} "
            f"has stayed far above its recent history (by default 20x its running average, "
            f"on 3 of the last 8 steps), though every value is finite. Try a lower lr or "
            f"\"gradient_clipping\"; the config key \"divergence_check\" tunes or turns off "
            f"this check. Warned once per episode (StepInfo.diverging stays True during it).",
            DivergenceWarning, stacklevel=stacklevel)

    def _warn_double_reduction(self, stacklevel: int) -> None:
        """Warns once per optimizer that the gradients came averaged."""
        self._double_reduction_reported = True
        warnings.warn(
            "dsopt: the gradients of this step were already averaged across ranks (equal on "
            "every rank), e.g. by torch's DistributedDataParallel, and dsopt averaged them "
            "again: twice the gradient traffic, and no savings from compression. Make dsopt's "
            "reduction the only one: ddp_model.register_comm_hook(None, "
            "dsopt.torch.ddp_comm_hook), or use dsopt.hf.Trainer or "
            "dsopt.lightning.DsoptStrategy, which do it.",
            DoubleReductionWarning, stacklevel=stacklevel)

    # ---- learning rates and loss scale -----------------------------------

    @property
    def num_groups(self) -> int:
        out = ffi.new("int32_t *")
        check(lib.dsopt_num_groups(self._live(), out))
        return int(out[0])

    def get_group_lr(self, group: int) -> float:
        out = ffi.new("double *")
        check(lib.dsopt_get_lr(self._live(), as_int32(group, "group"), out))
        return float(out[0])

    def set_group_lr(self, group: int, lr: float) -> None:
        check(lib.dsopt_set_group_lr(self._live(), as_int32(group, "group"), as_float(lr, "lr")))

    @property
    def lr(self) -> float:
        """Learning rate of group 0; setting it sets every group's."""
        return self.get_group_lr(0)

    @lr.setter
    def lr(self, value: float) -> None:
        check(lib.dsopt_set_lr(self._live(), as_float(value, "lr")))

    @property
    def loss_scale(self) -> float:
        """Scale to multiply the next loss by (1.0 without loss scaling)."""
        out = ffi.new("double *")
        check(lib.dsopt_get_loss_scale(self._live(), out))
        return float(out[0])

    @property
    def gradient_clipping(self) -> float:
        """The global gradient norm's limit (``"gradient_clipping"``; 0.0:
        off). Settable between steps, with the same value on every rank."""
        out = ffi.new("double *")
        check(lib.dsopt_get_gradient_clipping(self._live(), out))
        return float(out[0])

    @gradient_clipping.setter
    def gradient_clipping(self, max_norm: float) -> None:
        check(lib.dsopt_set_gradient_clipping(self._live(), float(max_norm)))

    @property
    def threads(self) -> int:
        """The CPU threads of this optimizer's host work: the config's
        ``"threads"``, or by default this process's share of the cores it
        may run on among the communicator's ranks on the same machine and
        cores (``OMP_NUM_THREADS``, when set, instead; docs/reference/config.md)."""
        out = ffi.new("int32_t *")
        check(lib.dsopt_get_threads(self._live(), out))
        return int(out[0])

    @property
    def config(self) -> dict:
        """The canonical configuration (``dsopt_get_config``): every key
        with its effective value, defaults filled in, aliases resolved, the
        group hyperparameters and gradient clipping as they are now. A new
        ``Optimizer`` from it has the same ``config``."""
        handle = self._live()
        return json.loads(_config.read_text(
            lambda dst, cap, size: lib.dsopt_get_config(handle, dst, cap, size)))

    #: The names ``get_group_param`` / ``set_group_param`` take for Adam,
    #: AdamW, LAMB and the 1-bit optimizers; ``group_param_names`` has this
    #: optimizer's.
    GROUP_PARAMS = ("lr", "beta1", "beta2", "eps", "weight_decay")

    @property
    def group_param_names(self) -> tuple:
        """The names ``get_group_param`` / ``set_group_param`` take for this
        optimizer's algorithm, in order (``dsopt_group_param_names``; Lion:
        no "eps")."""
        if self._group_param_names is None:
            optimizer_type = self.config["optimizer"]["type"]
            self._group_param_names = tuple(n for n, _ in _config.group_params(optimizer_type))
        return self._group_param_names

    def get_group_param(self, group: int, name: str) -> float:
        """Hyperparameter ``name`` of group ``group``, one of
        ``group_param_names`` (``dsopt_get_group_param``)."""
        out = ffi.new("double *")
        check(lib.dsopt_get_group_param(self._live(), as_int32(group, "group"),
                                        _param_name(name), out))
        return float(out[0])

    def set_group_param(self, group: int, name: str, value: float) -> None:
        """Sets hyperparameter ``name`` of group ``group`` from the next step
        on (``dsopt_set_group_param``; part of the state blob). Not
        collective: set the same value on every rank. Raises
        ``InvalidArgument`` (nothing changes) for an unknown name, a group
        out of range or an invalid value."""
        check(lib.dsopt_set_group_param(self._live(), as_int32(group, "group"),
                                        _param_name(name), as_float(value, name)))

    def state_names(self) -> list:
        """The names ``state_view`` takes for this optimizer, e.g.
        ``["exp_avg", "exp_avg_sq"]`` (plus ``"master"`` when a parameter
        is 16-bit; the 1-bit optimizers add ``"worker_error"``, 1-bit LAMB
        ``"exp_avg_sq_fresh"``)."""
        out = ffi.new("const char **")
        check(lib.dsopt_state_names(self._live(), out))
        return ffi.string(out[0]).decode("utf-8").split()

    def state_view(self, param_index: int, name: str) -> StateView:
        """State tensor ``name`` of parameter ``param_index`` as a view of
        dsopt's own fp32 memory, no copy (``dsopt_get_state_view``): a
        ``StateView`` whose ``data`` is a numpy float32 array (host) or a
        ``dsopt.CudaBuffer`` (device). Without ZeRO it is the whole
        parameter (``offset`` 0); under ZeRO stage 1/2 the part in this
        rank's shard, starting at element ``offset`` (possibly empty).

        The view always shows the current state. Writing through it is
        allowed between dsopt calls (not while gradients are handed over):
        the next step uses the new values; keep replicated state equal on
        every rank. It is valid until ``close()``: a host array keeps this
        Python object referenced, but ``close()`` frees the memory."""
        view = ffi.new("dsopt_state_view *")
        view.struct_size = ffi.sizeof("dsopt_state_view")
        check(lib.dsopt_get_state_view(self._live(), as_int64(param_index, "param_index"),
                                       _param_name(name), view))
        numel = int(view.tensor.numel)
        address = int(ffi.cast("uintptr_t", view.tensor.data))
        on_device = int(view.device) == lib.DSOPT_COMM_CUDA
        if numel == 0 or address == 0:
            data = _DeviceView(0, 0, self) if on_device else np.empty(0, np.float32)
        elif on_device:
            data = _DeviceView(address, numel, self)
        else:
            data = np.asarray(_HostView(address, numel, self))
        return StateView(data, int(view.offset), int(view.param_numel), on_device)

    def param_step(self, param_index: int) -> int:
        """Updates applied to parameter ``param_index`` (torch.optim's
        ``state["step"]``; ``dsopt_get_param_step``): the steps applied so
        far, less those in which its gradient was absent on every rank
        (Adam/AdamW)."""
        out = ffi.new("int64_t *")
        check(lib.dsopt_get_param_step(self._live(), as_int64(param_index, "param_index"), out))
        return int(out[0])

    def set_param_step(self, param_index: int, step: int) -> None:
        """Sets parameter ``param_index``'s update count (Adam/AdamW; the
        1-bit optimizers raise ``dsopt.Unsupported``). Not collective: set
        the same value on every rank."""
        check(lib.dsopt_set_param_step(self._live(), as_int64(param_index, "param_index"),
                                       as_int64(step, "step")))

    # ---- the deferred parameter allgather (ZeRO) ---------------------------

    @property
    def gather_buckets(self) -> int:
        """Buckets of ZeRO's parameter allgather (``dsopt_gather_num_buckets``;
        0 where parameters are never gathered: stage 0, one rank)."""
        out = ffi.new("int64_t *")
        check(lib.dsopt_gather_num_buckets(self._live(), out))
        return int(out[0])

    def gather_bucket_of(self, param_index: int) -> int:
        """The bucket after whose arrival parameter ``param_index`` is whole
        (buckets arrive in order, numbered in gather order, see
        ``set_gather_order``); -1 when it is never gathered."""
        out = ffi.new("int64_t *")
        check(lib.dsopt_gather_bucket_of(self._live(), as_int64(param_index, "param_index"), out))
        return int(out[0])

    def set_gather_order(self, order=None) -> None:
        """Collective (``dsopt_gather_order``): the order in which the
        caller needs the parameters, e.g. the model's forward order: every
        parameter index once (``None`` or empty: the default, parameter
        order). From the next step on the deferred allgather posts its
        buckets in the order these parameters first need them, and
        ``gather_bucket_of`` / ``wait_gather_bucket`` number buckets by that
        position; values and state are the same whatever the order. Every
        rank passes the same order: ``ValueError`` on a rank whose order is
        not a permutation of the parameter indices, ``dsopt.Mismatch`` on
        the others and on every rank when the orders differ; nothing
        changes then."""
        handle = self._live()
        try:
            values = [] if order is None else [as_int64(i, "order[]") for i in order]
        except Exception:
            lib.dsopt_gather_order(handle, ffi.NULL, -1)  # fails on every rank together
            raise
        array = ffi.new("int64_t[]", values) if values else ffi.NULL
        check(lib.dsopt_gather_order(handle, array, len(values)))

    def gathers_pending(self) -> int:
        """Buckets of the last step's deferred allgather not arrived yet
        (``dsopt_gather_pending``; does not wait)."""
        out = ffi.new("int64_t *")
        check(lib.dsopt_gather_pending(self._live(), out))
        return int(out[0])

    def wait_gather(self, param_index: int = -1) -> None:
        """Waits until parameter ``param_index`` is whole (-1: every
        parameter) after a step with ``"deferred_allgather"``
        (``dsopt_gather_wait``). Every other method waits for every bucket
        itself."""
        check(lib.dsopt_gather_wait(self._live(), as_int64(param_index, "param_index")))

    def wait_gather_bucket(self, bucket: int = -1) -> None:
        """Waits until buckets 0 .. ``bucket`` have arrived (-1: every
        bucket; ``dsopt_gather_wait_bucket``)."""
        check(lib.dsopt_gather_wait_bucket(self._live(), as_int64(bucket, "bucket")))

    # ---- momentum masks (1-bit optimizers) ---------------------------------

    def set_momentum_mask(self, param_index: int, mask) -> None:
        """Sets (or, with ``None``, clears) the momentum mask of parameter
        ``param_index``: a float32 array with the parameter's numel,
        multiplied into the momentum after every compressed step. dsopt
        copies it. Not collective; set the same masks on every rank. Raises
        ``dsopt.Unsupported`` for optimizers without masks (Adam)."""
        handle = self._live()
        index = as_int64(param_index, "param_index")
        if mask is None:
            check(lib.dsopt_set_momentum_mask(handle, index, ffi.NULL))
            return
        buf = describe(mask, writable=False, what="mask")
        tensor = ffi.new("dsopt_tensor *")
        tensor.data = ffi.cast("void *", buf.address)
        tensor.numel = buf.numel
        tensor.dtype = buf.dtype
        tensor.group = 0
        check(lib.dsopt_set_momentum_mask(handle, index, tensor))

    # ---- state -----------------------------------------------------------

    def state_dict(self) -> bytes:
        """This rank's whole optimizer state as one checksummed blob."""
        handle = self._live()
        size = ffi.new("uint64_t *")
        check(lib.dsopt_state_size(handle, size))
        buf = ffi.new("char[]", max(int(size[0]), 1))
        written = ffi.new("uint64_t *")
        check(lib.dsopt_state_save(handle, buf, int(size[0]), written))
        return ffi.buffer(buf, int(written[0]))[:]

    def load_state_dict(self, blob, *, reset_rank_local=False, without_rank_local=False) -> bool:
        """Restores a blob from ``state_dict()`` (collective); validated
        completely before anything changes.

        A blob another rank saved at this world size whose state is partly
        that rank's own (1-bit Adam's and 1-bit LAMB's compression errors,
        0/1 Adam's errors and accumulator, a ZeRO shard) raises ``Mismatch``
        on every rank, saying what to load instead (this rank's own blob, or
        every rank's with ``load_state_dict_shards``). With
        ``reset_rank_local=True`` the 1-bit optimizers load such a blob's
        replicated state and reset the rank-local state, on every rank, as a
        load at another world size does (``DSOPT_LOAD_RESET_RANK_LOCAL``);
        a ZeRO shard still raises. The 1-bit optimizers' compression errors
        saved at another world size or under another topology (flat or
        node-aware, N nodes of R ranks: ``"topology"`` in the config) reset
        too. ``without_rank_local=True``: the blob carries no rank-local
        state (its rank-local sections may be empty, as the FSDP2 state dicts
        of dsopt.torch make them at another topology); the rest loads and the
        rank-local state resets on every rank
        (``DSOPT_LOAD_WITHOUT_RANK_LOCAL``). Returns True when rank-local
        state was reset (the same on every rank), else False."""
        handle = self._live()
        try:
            data = ffi.from_buffer(blob)
        except TypeError:
            raise InvalidArgumentType(
                f"state blob must be bytes-like, got {type(blob).__name__}") from None
        if not isinstance(reset_rank_local, bool):
            raise InvalidArgumentType(
                f"reset_rank_local must be a bool, got {type(reset_rank_local).__name__}")
        if not isinstance(without_rank_local, bool):
            raise InvalidArgumentType(
                f"without_rank_local must be a bool, got {type(without_rank_local).__name__}")
        flags = (lib.DSOPT_LOAD_RESET_RANK_LOCAL if reset_rank_local else 0) | \
            (lib.DSOPT_LOAD_WITHOUT_RANK_LOCAL if without_rank_local else 0)
        reset = ffi.new("int32_t *")
        try:
            check(lib.dsopt_state_load_ex(handle, data, len(data), flags, reset))
        except Mismatch as error:
            if "DSOPT_LOAD_RESET_RANK_LOCAL" not in str(error):
                raise
            raise Mismatch(f"{error} (here: load_state_dict(blob, reset_rank_local=True))",
                           status=error.status) from None
        return bool(reset[0])

    def load_state_dict_shards(self, blobs) -> None:
        """Restores a run saved at any world size from the blobs all its
        ranks wrote, in old-rank order (collective; every rank passes all of
        them). Adam/AdamW reshard ZeRO shards or stage-0 state into this
        rank's layout; everything is validated before anything changes."""
        handle = self._live()
        blobs = list(blobs)
        if not blobs:
            raise InvalidArgumentType("load_state_dict_shards needs at least one blob")
        views = []
        for i, blob in enumerate(blobs):
            try:
                views.append(ffi.from_buffer(blob))
            except TypeError:
                raise InvalidArgumentType(
                    f"blobs[{i}] must be bytes-like, got {type(blob).__name__}") from None
        pointers = ffi.new("void *[]", [ffi.cast("void *", v) for v in views])
        sizes = ffi.new("uint64_t[]", [len(v) for v in views])
        check(lib.dsopt_state_load_shards(handle, ffi.cast("const void *const *", pointers),
                                          sizes, len(views)))

    def memory_usage(self) -> dict:
        """Bytes dsopt holds for this optimizer on this rank:
        ``{"host": ..., "device": ...}`` (state, shards, buffers; not the
        caller's parameters or gradients)."""
        handle = self._live()
        host = ffi.new("uint64_t *")
        device = ffi.new("uint64_t *")
        check(lib.dsopt_memory_usage(handle, host, device))
        return {"host": int(host[0]), "device": int(device[0])}

    def state_memory_usage(self) -> dict:
        """The part of ``memory_usage()`` that is state the blob saves
        (moments, fp32 masters, compression errors):
        ``{"host": ..., "device": ...}``; the rest are gradient, scratch and
        communication buffers (``dsopt_state_memory_usage``)."""
        handle = self._live()
        host = ffi.new("uint64_t *")
        device = ffi.new("uint64_t *")
        check(lib.dsopt_state_memory_usage(handle, host, device))
        return {"host": int(host[0]), "device": int(device[0])}

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._params)} params"
        return f"<dsopt.Optimizer {state}>"


__all__ = ["DivergenceWarning", "Optimizer", "SkippedStepWarning", "StateView", "StepInfo"]
