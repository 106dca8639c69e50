"""Every configuration the planner compares, and the dsopt config of each
(the one the exactness test runs)."""

from dataclasses import dataclass

GRADIENT_CODECS = ("none", "int8", "int4", "sign")
PARAMETER_CODECS = ("none", "bf16", "int8")
KINDS = ("adamw", "zero1", "zero2", "czero", "onebit_adam", "onebit_lamb", "zoadam")


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


@dataclass(frozen=True)
class Config:
    kind: str
    gradients: str = "none"     # compressed ZeRO's codecs
    parameters: str = "none"
    overlap: bool = False       # gradients handed over during backward

    @property
    def name(self) -> str:
        base = {"adamw": "AdamW", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "onebit_adam": "1-bit Adam",
                "onebit_lamb": "1-bit LAMB", "zoadam": "0/1 Adam"}.get(self.kind)
        if self.kind == "czero":
            base = f"ZeRO-2 {self.gradients}/{self.parameters}"
        return base + (" +overlap" if self.overlap else "")

    @property
    def zero(self) -> bool:
        return self.kind in ("zero1", "zero2", "czero")

    @property
    def onebit(self) -> bool:
        return self.kind in ("onebit_adam", "onebit_lamb", "zoadam")

    def dsopt_config(self, model, settings: Settings) -> dict:
        """The dsopt config dict of this configuration."""
        opt = {"adamw": "AdamW", "zero1": "AdamW", "zero2": "AdamW", "czero": "AdamW",
               "onebit_adam": "OneBitAdam", "onebit_lamb": "OneBitLamb", "zoadam": "ZeroOneAdam"}[self.kind]
        params = {"lr": 1e-3}
        if self.kind in ("onebit_adam", "onebit_lamb"):
            params["freeze_step"] = settings.freeze_step
        if self.kind == "zoadam":
            params.update(var_freeze_step=settings.var_freeze_step,
                          var_update_scaler=settings.var_update_scaler,
                          local_step_scaler=settings.local_step_scaler,
                          local_step_clipper=settings.local_step_clipper)
        cfg = {"optimizer": {"type": opt, "params": params}}
        if model.dtype == "bf16":
            cfg["bf16"] = {"enabled": True}
        elif model.dtype == "fp16":
            cfg["fp16"] = {"enabled": True}
        if self.zero:
            z = {"stage": 1 if self.kind == "zero1" else 2,
                 "reduce_bucket_size": settings.reduce_bucket_size,
                 "allgather_bucket_size": settings.allgather_bucket_size}
            if self.kind == "czero":
                z["compression"] = {"gradients": self.gradients, "parameters": self.parameters,
                                    "error_feedback": settings.error_feedback,
                                    "gradient_block_size": settings.gradient_block_size,
                                    "parameter_block_size": settings.parameter_block_size}
            cfg["zero_optimization"] = z
        return cfg


def all_configs(overlap=True) -> list:
    """AdamW, ZeRO-1/2, compressed ZeRO-2 with each codec pair, 1-bit Adam,
    1-bit LAMB, 0/1 Adam; the AdamW and ZeRO ones also with overlap."""
    out = [Config("adamw"), Config("zero1"), Config("zero2")]
    out += [Config("czero", g, p) for g in GRADIENT_CODECS for p in PARAMETER_CODECS
            if (g, p) != ("none", "none")]
    out += [Config("onebit_adam"), Config("onebit_lamb"), Config("zoadam")]
    if overlap:
        out += [Config(c.kind, c.gradients, c.parameters, True) for c in out if c.kind in
                ("adamw", "zero1", "zero2", "czero")]
    return out


def by_name(name: str) -> Config:
    for c in all_configs():
        if c.name.lower() == name.lower():
            return c
    raise ValueError(f"unknown configuration {name!r}; known: " + ", ".join(c.name for c in all_configs()))
