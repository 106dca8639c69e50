"""plan(): every configuration's bytes, memory and predicted step time on a
cluster, and the choice among them."""

from dataclasses import dataclass

from . import bytes as pbytes
from .algorithms import BASELINE
from .configs import Config, Settings, all_configs
from .memory import memory
from .timing import step_time


@dataclass(frozen=True)
class Record:
    config: object
    bytes: object            # bytes.StepBytes
    run_bytes_per_step: float  # average over settings.steps updates
    memory: object           # memory.Memory
    time: object             # timing.StepTime of the steady (compressed / local) step
    phase_times: dict        # step kind -> StepTime (1-bit family: warmup, compressed, local)
    average_time: float      # over the run, by the schedule
    speedup: float = 1.0     # AdamW's average time / this one's
    cross_bytes: object = None          # bytes.StepBytes across node boundaries (info.bytes_inter_node)
    run_cross_per_step: float = 0.0     # their average over settings.steps updates

    @property
    def name(self) -> str:
        return self.config.name


BASE = Config(BASELINE)


def plan(model, cluster, compute: float, profile, settings: Settings = None, configs=None,
         backward_fraction=2 / 3, overlapping_comm=True, concurrent_comm=True) -> list:
    """A Record per configuration (default: all_configs()), speedups against AdamW."""
    settings = settings or Settings()
    if not compute >= 0:
        raise ValueError(f"compute time must be >= 0 seconds, got {compute!r}")
    if not 0 <= backward_fraction <= 1:
        raise ValueError(f"backward fraction must be in [0, 1], got {backward_fraction!r}")
    configs = list(configs or all_configs())
    P = cluster.ranks
    records = []
    topo = cluster.topo
    for cfg in configs:
        sb = pbytes.step_bytes(cfg, model, P, settings, topo)
        kinds = pbytes.phases(cfg, settings)
        times = {k: step_time(cfg, model, cluster, settings, profile, compute, backward_fraction, k,
                              overlapping_comm) for k, count in kinds}
        total = sum(times[k].total * count for k, count in kinds)
        steady = times["compressed"] if "compressed" in times else times["steady"]
        records.append(Record(cfg, sb, pbytes.run_bytes(cfg, model, P, settings, topo=topo) / settings.steps,
                              memory(cfg, model, P, settings, overlapping_comm=overlapping_comm,
                                     concurrent_comm=concurrent_comm, topo=topo),
                              steady, times, total / settings.steps, 1.0,
                              pbytes.step_cross_bytes(cfg, model, topo, settings),
                              pbytes.run_bytes(cfg, model, P, settings, topo=topo, cross=True) / settings.steps))
    base = next((r.average_time for r in records if r.config == BASE), None)
    if base is None:
        base = plan(model, cluster, compute, profile, settings, [BASE], backward_fraction)[0].average_time
    return [Record(r.config, r.bytes, r.run_bytes_per_step, r.memory, r.time, r.phase_times, r.average_time,
                   base / r.average_time if r.average_time > 0 else float("inf"), r.cross_bytes,
                   r.run_cross_per_step) for r in records]


def caller_memory(record, model) -> int:
    """The caller's parameters and gradients on a rank: FSDP2's shards and
    largest unsharded module (`fsdp.memory`'s caller), else the whole
    model's, a parameter and a gradient of the model's dtype per element."""
    if record.memory.caller is not None:
        return record.memory.caller
    return 2 * (2 if model.half else 4) * model.numel


def choose(records, memory_limit=None, exact_numerics=False, algorithms=None, caller_of=None):
    """(record, reason): the fastest configuration over the run that fits
    `memory_limit` bytes per rank (dsopt's own memory; with `caller_of`, a
    Model, also the caller's parameters and gradients, `caller_memory`:
    what FSDP2's rows are compared by), among those of
    `algorithms` (types; default: AdamW and the 1-bit family, the
    algorithms that replace AdamW's communication: another update rule is
    the user's choice, not the planner's); `exact_numerics` keeps to the
    configurations without compressed traffic (the replicated path and
    uncompressed ZeRO, which give their algorithm's results)."""
    if algorithms is None:
        pool = [r for r in records if r.config.algorithm == BASELINE or r.config.onebit]
    else:
        wanted = {Config(a).algorithm for a in algorithms}
        pool = [r for r in records if r.config.algorithm in wanted]
    extra = (lambda r: 0) if caller_of is None else (lambda r: caller_memory(r, caller_of))
    pool = [r for r in pool if memory_limit is None or r.memory.total + extra(r) <= memory_limit]
    if exact_numerics:
        pool = [r for r in pool if r.config.exact]
    if not pool:
        raise ValueError("no configuration fits the memory limit")
    best = min(pool, key=lambda r: (round(r.average_time, 12), r.memory.total))
    base = next((r for r in records if r.config == BASE), None)
    t = best.time
    parts = {"compute": t.compute, "update": t.update, "compression": t.compression, "communication": t.exposed}
    bound = max(parts, key=parts.get)
    reason = f"{best.average_time * 1e3:.1f} ms per step"
    if base is not None and best is not base:
        reason += f", {best.speedup:.2f}x AdamW's {base.average_time * 1e3:.1f} ms"
    reason += f"; {bound} dominates its step ({parts[bound] / t.total:.0%})"
    if not best.config.exact:
        reason += "; compressed traffic changes the numerics: check the loss (docs/guides/planner.md)"
    return best, reason
