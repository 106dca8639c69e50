"""Every configuration the planner compares, and the dsopt config of each
(the one the exactness test runs). A configuration is an algorithm the
library registers (`algorithms.py`), a gradient path and, on compressed
ZeRO, its codecs."""

from dataclasses import dataclass

from .algorithms import BASELINE, describe, names, same_but_name

GRADIENT_CODECS = ("none", "int8", "int4", "sign")
PARAMETER_CODECS = ("none", "bf16", "int8")
# Gradient paths: the replicated allreduce (the 1-bit family: its own
# compressed allreduce), ZeRO-1, ZeRO-2, compressed ZeRO-2; PyTorch's FSDP2
# (its collectives, or dsopt.torch.fsdp's codes), and HSDP by dsopt (FSDP2
# inside each node, dsopt's exchange across the nodes' replicas:
# docs/guides/fsdp2.md).
PATHS = ("replicated", "zero1", "zero2", "czero", "fsdp2", "hsdp")
FSDP_PATHS = ("fsdp2", "hsdp")
_PATH_NAMES = {"zero1": "ZeRO-1", "zero2": "ZeRO-2", "czero": "ZeRO-2", "fsdp2": "FSDP2", "hsdp": "HSDP"}
# The spellings of the planner's earlier Config(kind): the paths with the
# baseline algorithm, and these three.
_EARLIER = {"onebit_adam": "OneBitAdam", "onebit_lamb": "OneBitLamb", "zoadam": "ZeroOneAdam"}


@dataclass(frozen=True)
class Settings:
    """The knobs that change bytes, memory or the schedule (dsopt's defaults)."""
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    gradient_block_size: int = 64
    parameter_block_size: int = 256
    error_feedback: bool = True
    steps: int = 100_000            # length of the run, for the 1-bit family's average
    freeze_step: int = 15_000       # 1-bit Adam/LAMB: first compressed update
    var_freeze_step: int = 15_000   # 0/1 Adam
    var_update_scaler: int = 16
    local_step_scaler: int = 32678
    local_step_clipper: int = 16

    def __post_init__(self):
        for name in ("reduce_bucket_size", "allgather_bucket_size", "gradient_block_size",
                     "parameter_block_size", "steps", "freeze_step", "var_update_scaler",
                     "local_step_scaler", "local_step_clipper"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not isinstance(self.var_freeze_step, int) or self.var_freeze_step < 0:
            raise ValueError(f"var_freeze_step must be an integer >= 0, got {self.var_freeze_step!r}")
        for name in ("gradient_block_size", "parameter_block_size"):
            v = getattr(self, name)
            if v % 8 or not 8 <= v <= 65536:
                raise ValueError(f"{name} must be a multiple of 8 in [8, 65536], got {v}")


@dataclass(frozen=True, init=False)
class Config:
    """`algorithm`: a registered type (or alias); `path`: one of PATHS
    (default "replicated"); `gradients`, `parameters`: compressed ZeRO's
    codecs; `overlap`: gradients handed over during backward. The earlier
    spelling Config(kind) still reads: "adamw", "zero1", "zero2", "czero"
    (AdamW on that path), "onebit_adam", "onebit_lamb", "zoadam"."""
    algorithm: str
    path: str
    gradients: str
    parameters: str
    overlap: bool

    def __init__(self, algorithm: str = BASELINE, gradients: str = "none", parameters: str = "none",
                 overlap: bool = False, path: str = None):
        if path is None and algorithm in PATHS:
            algorithm, path = BASELINE, algorithm
        alg = describe(_EARLIER.get(algorithm, algorithm))
        path = path or "replicated"
        if path not in PATHS:
            raise ValueError(f"unknown gradient path {path!r}; known: " + ", ".join(PATHS))
        if path == "fsdp2" and alg.compressed:
            raise ValueError(f"{alg.type} runs across replicas: under FSDP2 use path 'hsdp' "
                             "(docs/guides/fsdp2.md)")
        if path == "hsdp" and overlap:
            raise ValueError("FSDP2 reduce-scatters during backward itself: no overlap flag")
        if path not in ("replicated",) + FSDP_PATHS and not alg.zero:
            raise ValueError(f"{alg.type} does not run under ZeRO (dsopt_algorithm_describe)")
        if overlap and alg.compressed:
            raise ValueError(f"{alg.type} takes no gradients handed over during backward in the planner")
        if gradients not in GRADIENT_CODECS or parameters not in PARAMETER_CODECS:
            raise ValueError(f"unknown codecs {gradients}/{parameters}")
        for field, value in (("algorithm", alg.type), ("path", path), ("gradients", gradients),
                             ("parameters", parameters), ("overlap", bool(overlap))):
            object.__setattr__(self, field, value)

    @property
    def info(self):
        """The algorithm's description (algorithms.Algorithm)."""
        return describe(self.algorithm)

    @property
    def name(self) -> str:
        base = _PATH_NAMES.get(self.path)
        if self.path == "czero" or (self.fsdp and (self.gradients, self.parameters) != ("none", "none")):
            base = f"{base} {self.gradients}/{self.parameters}"
        if self.algorithm != BASELINE or base is None:
            base = self.info.label + (f" {base}" if base else "")
        return base + (" +overlap" if self.overlap else "")

    @property
    def zero(self) -> bool:
        """dsopt's ZeRO-1/2 (compressed or not)."""
        return self.path in ("zero1", "zero2", "czero")

    @property
    def fsdp(self) -> bool:
        """FSDP2 or HSDP: the parameters sharded by FSDP2 (`fsdp.py`)."""
        return self.path in FSDP_PATHS

    @property
    def codecs(self) -> bool:
        """Compressed ZeRO (its codecs)."""
        return self.path == "czero"

    @property
    def onebit(self) -> bool:
        """The 1-bit family (COMPRESSED): its own compressed allreduce."""
        return self.info.compressed

    @property
    def exact(self) -> bool:
        """Gives its algorithm's uncompressed results (no codec, no 1-bit
        compression)."""
        return not self.onebit and not self.codecs and not (
            self.fsdp and (self.gradients, self.parameters) != ("none", "none"))

    def dsopt_config(self, model, settings: Settings) -> dict:
        """The dsopt config dict of this configuration."""
        keys = self.info.keys
        params = {"lr": 1e-3}
        if "freeze_step" in keys:
            params["freeze_step"] = settings.freeze_step
        if "var_freeze_step" in keys:
            params.update(var_freeze_step=settings.var_freeze_step,
                          var_update_scaler=settings.var_update_scaler,
                          local_step_scaler=settings.local_step_scaler,
                          local_step_clipper=settings.local_step_clipper)
        cfg = {"optimizer": {"type": self.algorithm, "params": params}}
        if model.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        elif model.dtype == "fp16":
            cfg["fp16"] = {"enabled": True}
        if self.zero:
            z = {"stage": 1 if self.path == "zero1" else 2,
                 "reduce_bucket_size": settings.reduce_bucket_size,
                 "allgather_bucket_size": settings.allgather_bucket_size}
            if self.codecs:
                z["compression"] = {"gradients": self.gradients, "parameters": self.parameters,
                                    "error_feedback": settings.error_feedback,
                                    "gradient_block_size": settings.gradient_block_size,
                                    "parameter_block_size": settings.parameter_block_size}
            cfg["zero_optimization"] = z
        return cfg


def _codec_pairs():
    return [(g, p) for g in GRADIENT_CODECS for p in PARAMETER_CODECS if (g, p) != ("none", "none")]


def configs_of(algorithm: str, overlap=True, codecs=True) -> list:
    """Every configuration of one algorithm: the replicated path, and where
    it runs under ZeRO, ZeRO-1, ZeRO-2 and (`codecs`) compressed ZeRO-2
    with each codec pair; (`overlap`) the uncompressed ones again with
    gradients handed over during backward."""
    alg = describe(algorithm)
    out = [Config(alg.type)]
    if alg.zero:
        out += [Config(alg.type, path="zero1"), Config(alg.type, path="zero2")]
        if codecs:
            out += [Config(alg.type, g, p, path="czero") for g, p in _codec_pairs()]
    if overlap and not alg.compressed:
        out += [Config(c.algorithm, c.gradients, c.parameters, True, c.path) for c in out]
    return out


def fsdp_configs(algorithms=None) -> list:
    """FSDP2's configurations: for AdamW (default; or each of `algorithms`
    but the 1-bit family) FSDP2 with its own collectives and with each
    codec pair of dsopt.torch.fsdp; HSDP by dsopt with AdamW's plain
    average and with each of the 1-bit family across the replicas."""
    types = [BASELINE] if algorithms is None else [describe(a).type for a in algorithms]
    out = []
    for t in dict.fromkeys(types):
        if describe(t).compressed:
            continue
        out += [Config(t, path="fsdp2")]
        out += [Config(t, g, p, path="fsdp2") for g, p in _codec_pairs()]
    hsdp = [BASELINE] + [t for t in names() if describe(t).compressed]
    return out + [Config(t, path="hsdp") for t in hsdp]


def all_configs(overlap=True, algorithms=None) -> list:
    """`algorithms` None: the default table, AdamW on every path (compressed
    ZeRO-2 with each codec pair), each other registered algorithm on the
    replicated path and ZeRO-1/2 (but one whose description is another's
    but for its name: Adam, AdamW's), the 1-bit family, and
    (`overlap`) AdamW's rows again with gradients handed over during
    backward. A list of types: every configuration of each (`configs_of`)."""
    if algorithms is not None:
        types = [describe(a).type for a in algorithms]
        out = []
        for t in dict.fromkeys(types):
            out += configs_of(t, overlap=False)
        if overlap:
            out += [Config(c.algorithm, c.gradients, c.parameters, True, c.path) for c in out
                    if not c.onebit]
        return out
    base = configs_of(BASELINE, overlap=False)
    seen = {same_but_name(describe(BASELINE))}
    others, onebit = [], []
    for t in names():
        alg = describe(t)
        if same_but_name(alg) in seen:
            continue
        seen.add(same_but_name(alg))
        if alg.compressed:
            onebit += configs_of(t, overlap=False)
        else:
            others += configs_of(t, overlap=False, codecs=False)
    out = base + others + onebit
    if overlap:
        out += [Config(c.algorithm, c.gradients, c.parameters, True, c.path) for c in base]
    return out


def by_name(name: str, configs=None) -> Config:
    pool = configs if configs is not None else all_configs(algorithms=names())
    for c in pool:
        if c.name.lower() == name.lower():
            return c
    raise ValueError(f"unknown configuration {name!r}; known: " + ", ".join(c.name for c in all_configs()))
