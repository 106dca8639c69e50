"""The model as the planner sees it: the element count of each parameter
tensor, in order, and their dtype ("fp32", "bf16" or "fp16"; one for all);
for FSDP2's configurations, optionally its FSDP modules
(`fsdp_layout.FsdpModule`, their tensors in `sizes`' order)."""

from dataclasses import dataclass

from math import prod

from .fsdp_layout import FsdpModule
from .units import parse_count

DTYPES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}


@dataclass(frozen=True)
class Model:
    sizes: tuple
    dtype: str = "fp32"
    modules: tuple = None

    def __post_init__(self):
        if not self.sizes:
            raise ValueError("model: at least one tensor is needed")
        for n in self.sizes:
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"model: tensor sizes must be positive integers, got {n!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"model: dtype must be one of fp32, bf16, fp16, got {self.dtype!r}")
        if self.modules is not None:
            mods = tuple(m if isinstance(m, FsdpModule) else FsdpModule(*m) for m in self.modules)
            numels = [prod(s) for m in mods for s in m.shapes]
            if numels != list(self.sizes):
                raise ValueError("model: the FSDP modules' tensors must be the tensors of sizes, in order")
            object.__setattr__(self, "modules", mods)
        object.__setattr__(self, "dtype", {"float32": "fp32", "bfloat16": "bf16",
                                           "float16": "fp16"}.get(self.dtype, self.dtype))

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    @property
    def half(self) -> bool:
        """16-bit parameters (fp32 masters under ZeRO, 2-byte allgather)."""
        return DTYPES[self.dtype] == 2

    @property
    def tensors(self) -> int:
        return len(self.sizes)

    @classmethod
    def from_params(cls, count, dtype="fp32", tensors=None) -> "Model":
        """``count`` parameters cut into ``tensors`` tensors of nearly equal
        size (default: as many as make each at most 2^24 elements). The
        tensor count changes the 1-bit family's padding and 8 bytes of
        scales per tensor and rank, and the buckets that handed-over
        gradients open at once."""
        n = parse_count(count, "parameter count")
        t = -(-n // 2 ** 24) if tensors is None else parse_count(tensors, "tensor count")
        if t > n:
            raise ValueError(f"model: {t} tensors cannot hold {n} parameters")
        base, extra = divmod(n, t)
        return cls(tuple(base + (1 if i < extra else 0) for i in range(t)), dtype)

    @classmethod
    def from_modules(cls, modules, dtype="fp32") -> "Model":
        """A model of FSDP modules (`FsdpModule`, or (shapes, reshard) pairs)."""
        mods = tuple(m if isinstance(m, FsdpModule) else FsdpModule(*m) for m in modules)
        return cls(tuple(prod(s) for m in mods for s in m.shapes), dtype, mods)

    @classmethod
    def from_fsdp(cls, model, dtype=None) -> "Model":
        """The FSDP modules of a ``fully_shard``ed torch model: per module
        (``model.modules()`` order) the global shapes of its own trainable
        parameters; the root keeps its parameters gathered after forward
        (torch is imported by the caller, not here)."""
        from ..torch.fsdp._internals import fsdp_modules, param_groups
        mods, dtypes = [], set()
        for name, sub in fsdp_modules(model):
            params = [p.sharded_param for g in param_groups(sub) for p in g.fsdp_params
                      if p.sharded_param.requires_grad]
            dtypes |= {str(p.dtype).replace("torch.", "") for p in params}
            if params:
                mods.append(FsdpModule(tuple(tuple(p.shape) for p in params), reshard=bool(name)))
        if not mods:
            raise ValueError("model: no fully_shard'ed module with trainable parameters")
        if dtype is None:
            dtype = dtypes.pop() if len(dtypes) == 1 else "fp32"
        return cls.from_modules(mods, dtype)

    @classmethod
    def from_sizes(cls, sizes, dtype="fp32") -> "Model":
        return cls(tuple(int(s) for s in sizes), dtype)

    @classmethod
    def from_torch(cls, module, dtype=None) -> "Model":
        """The trainable parameters of a torch module, in ``parameters()``
        order (torch is imported by the caller, not here)."""
        params = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model: the module has no trainable parameters")
        if dtype is None:
            names = {str(p.dtype).replace("torch.", "") for p in params}
            dtype = names.pop() if len(names) == 1 else "fp32"
        return cls(tuple(int(p.numel()) for p in params), dtype)
