"""One exception class per dsopt status code, and ``check(rc)``."""

from ._lib import ffi, lib


class DsoptError(Exception):
    """A dsopt call failed. ``status`` is the C status code (negative), or
    None for an argument the binding rejected before calling the library."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgument(DsoptError, ValueError):
    status = lib.DSOPT_EINVAL


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong Python type or dtype (also a TypeError)."""


class Unsupported(DsoptError):
    status = lib.DSOPT_EUNSUPPORTED


class OutOfMemory(DsoptError, MemoryError):
    status = lib.DSOPT_ENOMEM


class BufferTooSmall(DsoptError):
    status = lib.DSOPT_EBUFS


class CorruptState(DsoptError):
    status = lib.DSOPT_ECORRUPT


class Mismatch(DsoptError):
    status = lib.DSOPT_EMISMATCH


class CommError(DsoptError):
    status = lib.DSOPT_ECOMM


class CudaError(DsoptError):
    status = lib.DSOPT_ECUDA


class InternalError(DsoptError):
    status = lib.DSOPT_EINTERNAL


class NonFiniteError(DsoptError):
    """Training is not progressing: ``max_consecutive_skips`` steps in a row
    were skipped for Inf/NaN gradients, or fp16 gradients overflowed with the
    loss scale already at ``fp16.min_loss_scale`` (``"max_consecutive_skips":
    0`` turns both checks off). Raised by ``step`` on every rank; that step
    was skipped like any other (nothing changed) and the next ``step`` may
    continue. ``info`` is the ``StepInfo`` of that step (None when the error
    did not come from a step)."""

    status = lib.DSOPT_ENONFINITE
    info = None


class DoubleReductionWarning(UserWarning):
    """The gradients dsopt was about to average had already been averaged
    across ranks (bit-identical on every rank), e.g. by
    ``torch.nn.parallel.DistributedDataParallel``: every gradient crossed
    the network twice, and compression saved nothing. dsopt checks the
    run's first 3 steps (``StepInfo.grads_replicated``) and ``step`` warns
    once per optimizer. The fix is to let dsopt's reduction be the only one:
    ``ddp_model.register_comm_hook(None, dsopt.torch.ddp_comm_hook)``, or
    ``dsopt.hf.Trainer`` / ``dsopt.lightning.DsoptStrategy``, which do it."""


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgument, Unsupported, OutOfMemory, BufferTooSmall, CorruptState,
        Mismatch, CommError, CudaError, InternalError, NonFiniteError,
    )
}


def _text(c_string) -> str:
    return ffi.string(c_string).decode("utf-8", "replace")


def check(rc: int) -> int:
    """Returns ``rc`` when it is DSOPT_OK; otherwise raises the DsoptError
    subclass for the code, with the thread's dsopt_last_error() text.

    Call it right after the failing call, on the same thread."""
    if rc == lib.DSOPT_OK:
        return rc
    detail = _text(lib.dsopt_last_error())
    summary = _text(lib.dsopt_status_string(rc))
    message = f"{summary}: {detail}" if detail else summary
    raise _BY_STATUS.get(rc, InternalError)(message, status=rc)


__all__ = [
    "DoubleReductionWarning", "DsoptError", "InvalidArgument", "InvalidArgumentType",
    "Unsupported", "OutOfMemory", "BufferTooSmall", "CorruptState", "Mismatch", "CommError", "CudaError", "InternalError",
    "NonFiniteError", "check",
]
