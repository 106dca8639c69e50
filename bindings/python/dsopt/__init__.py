"""dsopt: data-parallel optimizers (Adam/AdamW, ...) behind a C ABI.

    import numpy as np, dsopt
    params = [np.random.rand(1000).astype(np.float32)]
    with dsopt.Optimizer({"optimizer": {"type": "AdamW"}}, params) as opt:
        info = opt.step([np.random.rand(1000).astype(np.float32)])

Every failing dsopt call raises a subclass of ``dsopt.DsoptError`` (one per
status code) whose text includes the library's detail message. A step skipped
for Inf/NaN gradients warns (``dsopt.SkippedStepWarning``, rate-limited); a
run that stops progressing raises ``dsopt.NonFiniteError``. Gradients that
something else has already averaged across ranks warn once
(``dsopt.DoubleReductionWarning``). A run whose gradient norm stays far above
its own recent history while every value is finite warns once per episode
(``dsopt.DivergenceWarning``).
"""

from ._lib import ffi, lib
from .codec import Codec
from .communicator import Communicator, CudaBuffer
from .errors import (
    BufferTooSmall,
    CommError,
    CorruptState,
    CudaError,
    DoubleReductionWarning,
    DsoptError,
    InternalError,
    InvalidArgument,
    InvalidArgumentType,
    Mismatch,
    NonFiniteError,
    OutOfMemory,
    Unsupported,
    check,
)
from . import config as _config
from .algorithms import Algorithm, Hyperparameter, algorithm_names, describe
from .optimizer import DivergenceWarning, Optimizer, SkippedStepWarning, StateView, StepInfo
from .tensors import bf16


def canonical_config(config) -> dict:
    """The canonical form of a config (dict or JSON text): every key with
    its effective value, defaults filled in, aliases resolved
    (``dsopt_config_canonical``; ``Optimizer.config`` of an optimizer
    created from it)."""
    return _config.canonical(config)


def group_params(optimizer_type) -> tuple:
    """The group hyperparameters of an algorithm (its ``optimizer.type``,
    any case or alias) as ``(name, config key)`` pairs, in order:
    ``(("lr", "lr"), ("beta1", "betas"), ...)`` (``dsopt_group_param_names``).
    The names are those ``Optimizer.get_group_param`` takes."""
    return _config.group_params(optimizer_type)


def version() -> str:
    """Version of the loaded libdsopt ("MAJOR.MINOR.PATCH")."""
    number = lib.dsopt_version_number()
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def build_info() -> str:
    """What the loaded library was built with (key=value pairs): version,
    CUDA, NCCL, MPI (the MPI library the plugin loads, or "unavailable"),
    the CPU instruction set in use. ``python -m dsopt`` prints it with the
    files in use."""
    return ffi.string(lib.dsopt_build_info()).decode("utf-8", "replace")


def library_path() -> str:
    """The file of the libdsopt this process loaded ("" where the process's
    mappings cannot be read)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if "/libdsopt.so" in path:
                    return path
    except OSError:
        pass
    return ""


# StepInfo.phase values (dsopt_step_info.phase, include/dsopt.h).
PHASE_SKIPPED = lib.DSOPT_PHASE_SKIPPED
PHASE_FULL = lib.DSOPT_PHASE_FULL
PHASE_COMPRESSED = lib.DSOPT_PHASE_COMPRESSED
PHASE_LOCAL = lib.DSOPT_PHASE_LOCAL
PHASE_SYNC = lib.DSOPT_PHASE_SYNC

HEADER_VERSION = (lib.DSOPT_VERSION_MAJOR, lib.DSOPT_VERSION_MINOR, lib.DSOPT_VERSION_PATCH)
__version__ = ".".join(map(str, HEADER_VERSION))

__all__ = [
    "Algorithm", "BufferTooSmall", "Codec", "CommError", "Communicator", "CorruptState", "CudaBuffer", "CudaError",
    "DivergenceWarning", "DoubleReductionWarning", "DsoptError", "HEADER_VERSION", "Hyperparameter", "InternalError", "InvalidArgument",
    "InvalidArgumentType", "Mismatch", "NonFiniteError", "Optimizer", "OutOfMemory",
    "PHASE_COMPRESSED", "PHASE_FULL", "PHASE_LOCAL", "PHASE_SKIPPED", "PHASE_SYNC", "SkippedStepWarning", "StateView", "StepInfo",
    "Unsupported",
    "algorithm_names", "bf16", "build_info", "canonical_config", "check", "describe", "group_params", "library_path", "version",
]
