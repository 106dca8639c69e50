"""The calibrated costs the timing model uses: seconds per element of the
library's own work (update rules, compression, codecs), measured by
`calibrate.py` on this machine, saved as JSON; and, when a communicator was
measured, its bandwidth and latency.

Without a profile the planner uses built-in defaults, labelled
uncalibrated: each cost is the bytes the work reads and writes per element
over an assumed memory bandwidth of 1.5 TB/s (a data-centre GPU)."""

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_PATH = Path(os.path.expanduser("~/.cache/dsopt/plan-profile.json"))
VERSION = 1

# Bytes read and written per element by each piece of work.
_DEFAULT_TRAFFIC = {
    "adamw": 28,                 # stage 0 step: g, p, m, v
    "zero_update": 28,           # per shard element
    "zero_pack": 12,             # per element: pack the bucket, write the gathered parameters
    "onebit_adam_update": 28, "onebit_adam_compress": 16,
    "onebit_lamb_warmup": 40, "onebit_lamb_update": 40, "onebit_lamb_compress": 16,
    "zoadam_full": 28, "zoadam_local": 36, "zoadam_compress": 16,
}
_GRAD_CODEC_TRAFFIC = {"none": 0, "int8": 14, "int4": 13, "sign": 12}
_PARAM_CODEC_TRAFFIC = {"none": 0, "bf16": 8, "int8": 9}
DEFAULT_MEMORY_BANDWIDTH = 1.5e12


def default_costs() -> dict:
    costs = {k: v / DEFAULT_MEMORY_BANDWIDTH for k, v in _DEFAULT_TRAFFIC.items()}
    for g, tg in _GRAD_CODEC_TRAFFIC.items():
        for p, tp in _PARAM_CODEC_TRAFFIC.items():
            if (g, p) != ("none", "none"):
                costs[f"codec:{g}/{p}"] = (tg + tp) / DEFAULT_MEMORY_BANDWIDTH
    return costs


@dataclass
class Profile:
    costs: dict = field(default_factory=default_costs)   # seconds per element
    calibrated: bool = False
    device: str = "uncalibrated defaults (1.5 TB/s memory assumed)"
    dtype: str = "fp32"
    numel: int = 0                 # elements of the model the calibration timed
    network: dict = None           # {"ranks", "bandwidth" (bytes/s per rank), "latency" (s), "communicator"}
    seconds: float = 0.0           # how long the calibration took

    def cost(self, key: str) -> float:
        if key not in self.costs:
            raise KeyError(f"profile has no cost {key!r}: recalibrate (python -m dsopt.plan --calibrate)")
        return self.costs[key]

    @property
    def label(self) -> str:
        if not self.calibrated:
            return "UNCALIBRATED built-in defaults (run python -m dsopt.plan --calibrate)"
        return f"calibrated on {self.device} ({self.dtype}, {self.numel:,} elements, {self.seconds:.0f} s)"

    def to_json(self) -> dict:
        return {"version": VERSION, "costs": self.costs, "calibrated": self.calibrated, "device": self.device,
                "dtype": self.dtype, "numel": self.numel, "network": self.network, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: dict) -> "Profile":
        if data.get("version") != VERSION:
            raise ValueError(f"profile version {data.get('version')!r} is not {VERSION}: recalibrate")
        costs = default_costs()
        costs.update({k: float(v) for k, v in data["costs"].items()})
        return cls(costs, bool(data.get("calibrated")), data.get("device", "?"), data.get("dtype", "fp32"),
                   int(data.get("numel", 0)), data.get("network"), float(data.get("seconds", 0.0)))


def save(profile: Profile, path=None) -> Path:
    path = Path(path) if path else DEFAULT_PATH
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile.to_json(), indent=1))
    tmp.replace(path)
    return path


def load(path=None, required=False) -> Profile:
    """The saved profile, or the uncalibrated defaults when there is none
    (`required`: a missing file is an error)."""
    path = Path(path) if path else DEFAULT_PATH
    if not path.exists():
        if required:
            raise FileNotFoundError(f"no profile at {path}: run python -m dsopt.plan --calibrate")
        return Profile()
    try:
        return Profile.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"profile {path} is not readable ({exc}): recalibrate") from exc
