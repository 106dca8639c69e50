"""dsopt's divergence rule (docs/reference/c-api.md "Divergence that stays finite";
``StepInfo.diverging``) in plain Python, for replaying recorded
gradient-norm series: how far a run stayed from the threshold, and what
other settings of ``"divergence_check"`` would have said. The tests check
that the library reports what ``replay`` says.

    python3 examples/python/divergence_rule.py SERIES.json [...] [--factor 20 ...]

A SERIES file is JSON: a list of per-step global gradient norms (skipped
steps as null or NaN), or an object holding one under "grad_norm",
"grad_norms" or "norms" (with "phase", the steps' StepInfo.phase, and
"ranks", the world size, when the run had several ranks), or an object of
such series by name. Prints, per series, the first reported step (counted
from 1), the episodes, the reported steps and the margin (see ``margin``).
``--as-world P`` replays a series of fewer ranks as if P ranks had run it,
in the worst case for the local norms: gradient noise dominates them, so
they grow by sqrt(P / ranks) (see ``as_world``).
"""
import argparse
import json
import math
from dataclasses import dataclass, field

DEFAULTS = dict(factor=20.0, min_steps=10, horizon=50, count=3, window=8)
SERIES_KEYS = ("grad_norm", "grad_norms", "norms")  # where a SERIES object holds its norms
BAND = math.log(2.0)  # each x enters the reference clamped to r +- BAND
PHASE_FULL = 1        # StepInfo.phase of a step whose gradients were averaged


@dataclass
class Rule:
    """The state of the rule over one run (the config's defaults)."""

    factor: float = DEFAULTS["factor"]
    min_steps: int = DEFAULTS["min_steps"]
    horizon: int = DEFAULTS["horizon"]
    count: int = DEFAULTS["count"]
    window: int = DEFAULTS["window"]
    seen: list = field(default_factory=lambda: [0, 0])        # per kind (averaged, local)
    reference: list = field(default_factory=lambda: [0.0, 0.0])  # r per kind, in ln(norm)
    recent: list = field(default_factory=list)  # above flags of the last `window` observed steps
    diverging: bool = False

    def observe(self, norm, local=False, world=1):
        """One step's norm (None/NaN: a skipped step, which changes
        nothing); `local`: some gradient stayed the rank's own at `world`
        > 1 ranks. Returns (diverging after it, the step's ratio
        norm / exp(r) or None before min_steps)."""
        if norm is None or not norm > 0.0:
            return self.diverging, None
        k = 1 if local else 0
        if self.seen[k] == 0 and self.seen[1 - k] > 0:  # the kind's first step
            self.seen[k] = self.seen[1 - k]
            self.reference[k] = self.reference[1 - k] + (0.5 if local else -0.5) * math.log(world)
        x = math.log(norm)
        r = self.reference[k]
        ratio = math.exp(min(x - r, 700.0)) if self.seen[k] >= self.min_steps else None
        above = self.seen[k] >= self.min_steps and x - r > math.log(self.factor)
        self.recent = ([above] + self.recent)[:self.window]
        if not self.diverging and sum(self.recent) >= self.count:
            self.diverging = True
        elif self.diverging and not any(self.recent):
            self.diverging = False
        if math.isfinite(x):
            if self.seen[k] == 0:
                self.reference[k] = x
            else:
                w = max(1.0 / (self.seen[k] + 1), 1.0 / self.horizon)
                self.reference[k] = r + w * (min(max(x, r - BAND), r + BAND) - r)
            self.seen[k] += 1
        return self.diverging, ratio


def is_nan(value):
    return value is None or (isinstance(value, float) and math.isnan(value))


def local_steps(phases, world):
    """Per step, whether its norm was local (StepInfo.phase not FULL at
    several ranks)."""
    return [world > 1 and phase != PHASE_FULL for phase in phases]


def replay(norms, local=None, world=1, **settings):
    """(per-step diverging flags, per-step ratios) of a norm series;
    `local`: per step, whether its norm was local (see local_steps)."""
    rule = Rule(**settings)
    flags, ratios = [], []
    for k, norm in enumerate(norms):
        flag, ratio = rule.observe(None if is_nan(norm) else norm, bool(local and local[k]), world)
        flags.append(flag)
        ratios.append(ratio)
    return flags, ratios


def margin(ratios, count=DEFAULTS["count"], window=DEFAULTS["window"]):
    """The largest factor at which the rule would have started an episode:
    over every `window` consecutive steps, the `count`-th largest ratio
    (1.0 when there is none). A healthy run's margin is how far it stayed
    below the factor."""
    best = 1.0
    for end in range(len(ratios)):
        seen = sorted((r for r in ratios[max(0, end - window + 1):end + 1] if r is not None), reverse=True)
        if len(seen) >= count:
            best = max(best, seen[count - 1])
    return best


def episodes(flags):
    """[(first step, last step)] of the reported episodes, counted from 1."""
    out, start = [], None
    for k, flag in enumerate(flags, 1):
        if flag and start is None:
            start = k
        if not flag and start is not None:
            out.append((start, k - 1))
            start = None
    if start is not None:
        out.append((start, len(flags)))
    return out


@dataclass
class Series:
    norms: list
    local: list = None  # per step, whether the norm was local
    world: int = 1


def as_world(series, world):
    """The series as `world` ranks would have produced it if gradient noise
    dominated every local norm (each rank's batch 1/world of the global
    one): local norms times sqrt(world / series.world), averaged ones as
    they are."""
    if series.local is None or series.world == 1:
        return series
    grow = math.sqrt(world / series.world)
    norms = [n * grow if local and not is_nan(n) else n for n, local in zip(series.norms, series.local)]
    return Series(norms, series.local, world)


def load_series(path):
    """{name: Series} of a SERIES file (see the top)."""
    def series(value):
        if isinstance(value, list):
            return Series(value)
        if not isinstance(value, dict):
            return None
        norms = next((value[k] for k in SERIES_KEYS if k in value), None)
        if norms is None:
            return None
        world = int(value.get("ranks", 1))
        local = local_steps(value["phase"], world) if "phase" in value else None
        if "skipped" in value:  # a skipped step's norm is not observed
            norms = [float("nan") if s else n for n, s in zip(norms, value["skipped"])]
        return Series(norms, local, world)

    with open(path) as f:
        data = json.load(f)
    if series(data) is not None:
        return {path: series(data)}
    return {f"{path}:{name}": series(v) for name, v in data.items() if series(v) is not None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("series", nargs="+")
    for key, value in DEFAULTS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--as-world", type=int, default=0, help="replay as if this many ranks had run it")
    args = parser.parse_args()
    settings = {key: getattr(args, key) for key in DEFAULTS}
    for path in args.series:
        for name, s in load_series(path).items():
            if args.as_world:
                s = as_world(s, args.as_world)
            flags, ratios = replay(s.norms, s.local, s.world, **settings)
            eps = episodes(flags)
            first = eps[0][0] if eps else None
            print(f"{name}: {len(s.norms)} steps, first reported {first}, {len(eps)} episodes, "
                  f"{sum(flags)} steps reported, margin {margin(ratios, args.count, args.window):.3g}")


if __name__ == "__main__":
    main()
