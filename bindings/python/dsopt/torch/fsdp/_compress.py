"""``compress(model, ...)``: dsopt's codes as FSDP2's collectives on every
FSDP module of a model, and the ``Compression`` it returns."""

import contextlib

import torch

from ...codec import Codec
from . import _residuals
from ._all_gather import CompressedAllGather
from ._internals import DefaultAllGather, DefaultReduceScatter, GroupView, fsdp_modules, param_groups
from ._reduce_scatter import CompressedReduceScatter

GRADIENT_CODECS = ("int8", "int4", "sign")
PARAMETER_CODECS = ("bf16", "int8")


class Compression:
    """What ``compress`` installed: per module (by its name in the model,
    "" for the root) a reduce-scatter and an all-gather. A Stateful for
    torch.distributed.checkpoint: ``state_dict`` / ``load_state_dict``
    carry this rank's residuals (see ``_residuals``)."""

    def __init__(self, settings, modules):
        self.gradients = settings["gradients"]
        self.parameters = settings["parameters"]
        self.gradient_block_size = settings["gradient_block_size"]
        self.parameter_block_size = settings["parameter_block_size"]
        self.error_feedback = settings["error_feedback"]
        self._modules = modules  # [(name, module, view, reduce-scatter, all-gather)]

    @property
    def module_names(self):
        return tuple(name for name, *_ in self._modules)

    @property
    def shard_numels(self):
        """{module name: m}, the elements of its gradient shard per rank:
        what its reduce-scatter outputs (every trainable parameter padded
        to an even shard; with no frozen parameter, also what its
        all-gather takes from each rank)."""
        return {name: view.shard_numel for name, _, view, *_ in self._modules}

    def collectives(self, name):
        """(reduce-scatter, all-gather) installed on the module ``name``."""
        for entry in self._modules:
            if entry[0] == name:
                return entry[3], entry[4]
        raise KeyError(f"no FSDP module {name!r} (modules: {list(self.module_names)})")

    @property
    def bytes_by_collective(self):
        """Bytes this rank sent since ``compress``, by collective."""
        return {"reduce_scatter": sum(e[3].bytes_sent for e in self._modules),
                "all_gather": sum(e[4].bytes_sent for e in self._modules)}

    @property
    def bytes_sent(self):
        """Bytes this rank sent in FSDP2's reduce-scatters and all-gathers
        since ``compress`` (uncompressed ones included, as a ring sends
        them): docs/guides/fsdp2-compression.md "Bytes"."""
        return sum(self.bytes_by_collective.values())

    @property
    def uncompressed_calls(self):
        """Calls that fell back to FSDP2's own collective (each warned
        once per module and reason: ``UncompressedWarning``)."""
        return sum(e[3].uncompressed_calls + e[4].uncompressed_calls for e in self._modules)

    @property
    def residual_bytes(self):
        """Memory of this rank's residuals (bytes)."""
        return sum(e[3].residual.numel() for e in self._modules if e[3].residual is not None)

    def _state_entries(self):
        return [(name or "<root>", rs.residual, view.mesh)
                for name, _, view, rs, _ in self._modules if rs.residual is not None]

    def _settings(self):
        return {"gradients": self.gradients, "gradient_block_size": self.gradient_block_size}

    def state_dict(self):
        """This rank's residuals (DTensors over each module's mesh) and the
        codec they belong to; empty residuals without error feedback."""
        return _residuals.state_dict(self._settings(), self._state_entries())

    def load_state_dict(self, state_dict):
        """Restores the residuals saved by ``state_dict`` at the same world
        size and mesh (bit for bit); on any mismatch ValueError, nothing
        changed."""
        _residuals.load_state_dict(self._settings(), self._state_entries(), state_dict)

    def remove(self):
        """Puts FSDP2's own collectives back on every module."""
        for _, module, *_ in self._modules:
            module.set_custom_reduce_scatter(DefaultReduceScatter())
            module.set_custom_all_gather(DefaultAllGather())
        self._modules = []

    def __repr__(self):
        return (f"Compression(gradients={self.gradients!r}, parameters={self.parameters!r}, "
                f"modules={len(self._modules)})")


def _check_names(gradients, parameters, gradient_block_size, parameter_block_size):
    if gradients not in GRADIENT_CODECS + (None,):
        raise ValueError(f"gradients must be one of {GRADIENT_CODECS} or None, got {gradients!r}")
    if parameters not in PARAMETER_CODECS + (None,):
        raise ValueError(f"parameters must be one of {PARAMETER_CODECS} or None, got {parameters!r}")
    for name, block in (("gradient_block_size", gradient_block_size),
                        ("parameter_block_size", parameter_block_size)):
        if not isinstance(block, int) or not 8 <= block <= 65536 or block % 8:
            raise ValueError(f"{name} must be a multiple of 8 in [8, 65536], got {block!r}")


def _refusals(name, views, gradients, parameters):
    """Why the codes cannot serve this module (empty: they can)."""
    where = f"module {name!r}" if name else "the root module"
    if len(views) > 1:
        return [f"{where} has {len(views)} FSDP parameter groups (per-parameter meshes from "
                "shard_placement_fn); FSDP2 takes one custom collective per module"]
    problems = []
    for view in views:
        if any(isinstance(c, (CompressedReduceScatter, CompressedAllGather)) for c in view.comms):
            problems.append(f"{where} is compressed already (Compression.remove() first)")
        elif not all(isinstance(c, (DefaultReduceScatter, DefaultAllGather)) for c in view.comms):
            problems.append(f"{where} has custom collectives of its own already")
        if view.param_dtypes != {torch.float32}:
            problems.append(f"{where} has parameters of dtype {sorted(map(str, view.param_dtypes))}; "
                            "the codes encode fp32 shards and fp32 gradients")
        param_dtypes = {p.param_dtype for p in view.policies} - {None, torch.float32}
        if parameters and param_dtypes:
            problems.append(f"{where} gathers its parameters in {sorted(map(str, param_dtypes))} "
                            "(MixedPrecisionPolicy.param_dtype): already a narrow all-gather; pass "
                            "parameters=None")
        reduce_dtypes = {p.reduce_dtype for p in view.policies} - {None, torch.float32}
        if gradients and reduce_dtypes:
            problems.append(f"{where} reduces its gradients in {sorted(map(str, reduce_dtypes))} "
                            "(MixedPrecisionPolicy.reduce_dtype); the codes take fp32 gradients: "
                            "reduce_dtype=torch.float32 or None")
        if gradients and view.divide_factor is not None:
            problems.append(f"{where} has a gradient divide factor ({view.divide_factor}: a scaled "
                            "sum); the codes reduce by a sum or an average")
    return problems


def compress(model, gradients="int4", parameters="int8", *, gradient_block_size=64,
             parameter_block_size=256, error_feedback=True, threads=None):
    """Installs dsopt's codes as the collectives of every FSDP module of a
    ``fully_shard``ed ``model`` (itself included) and returns the
    ``Compression``: ``gradients`` ("int8", "int4", "sign" or None) for the
    reduce-scatter, with a residual per module when ``error_feedback``;
    ``parameters`` ("bf16", "int8" or None) for the all-gather. None keeps
    FSDP2's collective, whose bytes are counted all the same (both None:
    the uncompressed baseline, counted). ``threads``: CPU threads of the
    codecs (default torch.get_num_threads()).

    Call it once, after ``fully_shard`` and before the first forward, on
    every rank. Checked first, for every module; on any refusal
    (ValueError naming each module and reason) nothing is installed:
    several parameter groups per module, parameters that are not fp32, a
    MixedPrecisionPolicy whose param_dtype (with ``parameters``) or
    reduce_dtype (with ``gradients``) is not fp32, a gradient divide factor,
    custom collectives already there. What can only be seen during
    training (gradients that are not fp32 or not all there, another
    reduction) runs FSDP2's own collective with an ``UncompressedWarning``.
    docs/guides/fsdp2-compression.md."""
    _check_names(gradients, parameters, gradient_block_size, parameter_block_size)
    modules = fsdp_modules(model)
    if not modules:
        raise TypeError(f"compress: {type(model).__name__} has no FSDP module; apply "
                        "torch.distributed.fsdp.fully_shard to it (and its blocks) first")
    found = [(name, module, [GroupView(g) for g in param_groups(module)]) for name, module in modules]
    problems = [p for name, _, views in found for p in _refusals(name, views, gradients, parameters)]
    if problems:
        raise ValueError("dsopt.torch.fsdp.compress: nothing installed:\n  " + "\n  ".join(problems))
    threads = torch.get_num_threads() if threads is None else threads
    codecs = {}

    def codec(name, block, device):
        if name is None:
            return None
        if name == "bf16":
            block = 0  # bf16 codes have no blocks (dsopt_codec_create refuses one)
        key = (name, block, str(device))
        if key not in codecs:
            # a CUDA codec takes the memory of the device current at its creation
            with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
                codecs[key] = Codec(name, block=block, device=device.type, threads=threads)
        return codecs[key]

    installed = []
    for name, module, views in found:
        if not views:
            continue
        view = views[0]
        grad_codec = codec(gradients, gradient_block_size, view.device)
        residual = None
        if grad_codec is not None and error_feedback and view.shard_size > 1 and view.shard_numel:
            size = view.shard_size * grad_codec.residual_size(view.shard_numel)
            residual = torch.zeros(size, dtype=torch.uint8, device=view.device)
        reduce_scatter = CompressedReduceScatter(name, grad_codec, view.shard_numel, residual)
        all_gather = CompressedAllGather(name, codec(parameters, parameter_block_size, view.device))
        module.set_custom_reduce_scatter(reduce_scatter)
        module.set_custom_all_gather(all_gather)
        installed.append((name, module, view, reduce_scatter, all_gather))
    settings = {"gradients": gradients, "parameters": parameters, "error_feedback": error_feedback,
                "gradient_block_size": gradient_block_size, "parameter_block_size": parameter_block_size}
    return Compression(settings, installed)
