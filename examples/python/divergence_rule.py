"""dsopt's divergence rule (README "Divergence that stays finite";
``StepInfo.diverging``) in plain Python, for replaying recorded
gradient-norm series: how far a run stayed from the threshold, and what
other settings of ``"divergence_check"`` would have said. The tests check
that the library reports what ``replay`` says.

    python3 examples/python/divergence_rule.py SERIES.json [...] [--factor 100 ...]

A SERIES file is JSON: a list of per-step global gradient norms (skipped
steps as null or NaN), or an object holding one under "grad_norm",
"grad_norms" or "norms", or an object of such series by name. Prints, per series, the first reported step (counted
from 1), the episodes, the reported steps and the margin (see ``margin``).
"""
import argparse
import json
import math
from dataclasses import dataclass, field

DEFAULTS = dict(factor=100.0, min_steps=10, horizon=50, count=3, window=8)
SERIES_KEYS = ("grad_norm", "grad_norms", "norms")  # where a SERIES object holds its norms


@dataclass
class Rule:
    """The state of the rule over one run (the config's defaults)."""

    factor: float = DEFAULTS["factor"]
    min_steps: int = DEFAULTS["min_steps"]
    horizon: int = DEFAULTS["horizon"]
    count: int = DEFAULTS["count"]
    window: int = DEFAULTS["window"]
    finite: int = 0            # finite norms observed
    reference: float = 0.0     # r, in ln(norm)
    recent: list = field(default_factory=list)  # above flags of the last `window` observed steps
    diverging: bool = False

    def observe(self, norm):
        """One step's norm (None/NaN: a skipped step, which changes
        nothing); returns (diverging after it, the step's ratio
        norm / exp(r) or None before min_steps)."""
        if norm is None or not norm > 0.0:
            return self.diverging, None
        x = math.log(norm)
        band = math.log(self.factor)
        ratio = math.exp(min(x - self.reference, 700.0)) if self.finite >= self.min_steps else None
        above = self.finite >= self.min_steps and x - self.reference > band
        self.recent = ([above] + self.recent)[:self.window]
        if not self.diverging and sum(self.recent) >= self.count:
            self.diverging = True
        elif self.diverging and not any(self.recent):
            self.diverging = False
        if math.isfinite(x):
            if self.finite == 0:
                self.reference = x
            else:
                w = max(1.0 / (self.finite + 1), 1.0 / self.horizon)
                clamped = min(max(x, self.reference - band), self.reference + band)
                self.reference += w * (clamped - self.reference)
            self.finite += 1
        return self.diverging, ratio


def replay(norms, **settings):
    """(per-step diverging flags, per-step ratios) of a norm series."""
    rule = Rule(**settings)
    flags, ratios = [], []
    for norm in norms:
        flag, ratio = rule.observe(None if norm is None or (isinstance(norm, float) and math.isnan(norm)) else norm)
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


def load_series(path):
    """{name: [norm per step]} of a SERIES file (see the top)."""
    def norms(value):
        if isinstance(value, list):
            return value
        return next((value[k] for k in SERIES_KEYS if isinstance(value, dict) and k in value), None)

    with open(path) as f:
        data = json.load(f)
    if norms(data) is not None:
        return {path: norms(data)}
    return {f"{path}:{name}": norms(v) for name, v in data.items() if norms(v) is not None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("series", nargs="+")
    for key, value in DEFAULTS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    settings = {key: getattr(args, key) for key in DEFAULTS}
    for path in args.series:
        for name, norms in load_series(path).items():
            flags, ratios = replay(norms, **settings)
            eps = episodes(flags)
            first = eps[0][0] if eps else None
            print(f"{name}: {len(norms)} steps, first reported {first}, {len(eps)} episodes, "
                  f"{sum(flags)} steps reported, margin {margin(ratios, args.count, args.window):.3g}")


if __name__ == "__main__":
    main()
