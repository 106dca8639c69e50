"""Bytes each rank sends per step (``info.bytes_sent``), exactly as the
library counts them (docs/guides/zero.md, compressed-zero.md,
onebit-adam.md, zero-one-adam.md "Bytes"), and the average over a run for
the 1-bit family's schedules.

Every collective dsopt call starts with a 16-byte allreduce (the
handshake); an allreduce of c bytes counts 2 (P-1) c / P (rounded down),
a reduce-scatter piece or allgather chunk of c bytes (P-1) c."""

from dataclasses import dataclass
from functools import lru_cache

from . import codecs
from .layout import car_padded, int8_block, shard_sums, zero_layout


def allreduce(world: int, nbytes: int) -> int:
    return 2 * (world - 1) * nbytes // world


def handshake(world: int) -> int:
    return allreduce(world, 16)


def full_allreduce(numel: int, world: int) -> int:
    """The fp32 gradient allreduce with its status float."""
    return allreduce(world, 4 * (numel + 1))


def compressed_allreduce(sizes, world: int) -> int:
    """The 1-bit compressed allreduce of tensors `sizes`: the signs of the
    padded elements once (a 1/P share to each rank, and the server's
    recompressed share back) and one 4-byte scale per tensor each way."""
    if world == 1:
        return 0
    padded = sum(car_padded(n, world) for n in sizes)
    return (world - 1) * padded // (4 * world) + 8 * (world - 1) * len(sizes)


def zero_exchange(model, world: int, settings, gradients="none", parameters="none") -> int:
    """ZeRO's reduce-scatter and parameter allgather (compressed or not)."""
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size,
                      int8_block(parameters, settings))
    width = 2 if model.half and parameters == "none" else 4
    total = sum((world - 1) * codecs.gradient_piece_bytes(gradients, settings.gradient_block_size, m)
                for m in lay.pieces)
    total += sum((world - 1) * codecs.parameter_chunk_bytes(parameters, settings.parameter_block_size, c, width)
                 for c in lay.chunks)
    return total


@dataclass(frozen=True)
class StepBytes:
    """Bytes per rank of each kind of step of a configuration."""
    steady: int               # a step after the first three (AdamW, ZeRO: every step)
    warmup: int = None        # 1-bit Adam/LAMB: a warmup step; 0/1 Adam: a full step
    compressed: int = None    # 1-bit step (0/1 Adam: a 1-bit step or a sync)
    local: int = None         # 0/1 Adam: a local step


def car_sizes(config, model, world: int):
    """The tensors the 1-bit compressed allreduce runs over: the model's
    tensors, or for a trust-ratio rule (1-bit LAMB) one fused tensor of
    every element, padded as the allreduce pads."""
    if config.info.trust_ratio:
        return [car_padded(model.numel, world)]
    return list(model.sizes)


def sums_exchange(config, model, world: int, settings) -> int:
    """A trust-ratio rule under ZeRO (LAMB): the allreduces of its
    whole-tensor norms over ||p|| and ||u|| (`layout.shard_sums`)."""
    if not (config.zero and config.info.trust_ratio) or world == 1:
        return 0
    s = shard_sums(model.sizes, zero_layout(model.numel, world, settings.reduce_bucket_size,
                                            settings.allgather_bucket_size,
                                            int8_block(config.parameters, settings)))
    return (allreduce(world, 2 * 4 * s.cut) if s.cut else 0) + allreduce(world, 2 * 8 * s.blocks)


def step_bytes(config, model, world: int, settings) -> StepBytes:
    """Bytes per rank of the steps after the third (the first three add a
    16-byte check of the gradients' hashes, `check_bytes`)."""
    if world == 1:
        return StepBytes(0, *((0, 0, 0) if config.onebit else ()))
    h = handshake(world)
    overlap = h if config.overlap else 0
    if config.zero:
        return StepBytes(2 * h + zero_exchange(model, world, settings, config.gradients, config.parameters)
                         + sums_exchange(config, model, world, settings) + overlap)
    if not config.onebit:
        return StepBytes(h + full_allreduce(model.numel, world) + overlap)
    warm = h + full_allreduce(model.numel, world)
    comp = 2 * h + compressed_allreduce(car_sizes(config, model, world), world)
    if config.info.schedule == "zero_one":
        return StepBytes(2 * h, warm, comp, 2 * h)
    return StepBytes(comp, warm, comp)


def check_bytes(world: int) -> int:
    """The gradient hash comparison of each of the first three updates."""
    return handshake(world)


# ---- schedules ------------------------------------------------------------

def onebit_phases(settings, steps=None):
    """1-bit Adam/LAMB: (warmup updates, compressed updates) of a run."""
    steps = settings.steps if steps is None else steps
    warm = min(steps, max(settings.freeze_step, 2) - 1)
    return warm, steps - warm


def zoadam_phases(settings, steps=None):
    return list(_zoadam_phases(settings, settings.steps if steps is None else steps))


@lru_cache(maxsize=64)
def _zoadam_phases(settings, steps):
    """0/1 Adam's schedule (docs/optimizers/zero-one-adam.md "Schedules"):
    the kind of every update in order, as a list of "full", "1bit",
    "local" and "sync"."""
    out = []
    frozen = False
    var_interval, var_counter = 1, 0
    local_interval, local_counter = 1, 0
    for u in range(1, steps + 1):
        k = u + 1
        if not frozen:
            if k % var_interval == 0:
                out.append("full")
                var_counter += 1
                if var_counter == settings.var_update_scaler:
                    var_counter, var_interval = 0, var_interval * 2
            else:
                out.append("1bit")
            if k > settings.var_freeze_step:
                frozen = True
        else:
            out.append("sync" if k % local_interval == 0 else "local")
            local_counter += 1
            if local_counter == settings.local_step_scaler:
                local_counter = 0
                local_interval = min(settings.local_step_clipper, 2 * local_interval)
    return tuple(out)


def zoadam_counts(settings, steps=None) -> dict:
    counts = {"full": 0, "1bit": 0, "local": 0, "sync": 0}
    for kind in zoadam_phases(settings, steps):
        counts[kind] += 1
    return counts


def phase_kinds(config) -> tuple:
    """The kinds of step of a configuration's schedule, as `phases` names them."""
    return {"freeze": ("warmup", "compressed"), "zero_one": ("warmup", "compressed", "local")}.get(
        config.info.schedule, ("steady",))


def phases(config, settings, steps=None) -> list:
    """(step kind, updates of that kind) over a run of `steps` updates
    (default settings.steps): "steady" for every uncompressed
    configuration; the 1-bit family's "warmup" and "compressed" steps, and
    0/1 Adam's "local" ones, by its schedule."""
    steps = settings.steps if steps is None else steps
    schedule = config.info.schedule
    if schedule == "freeze":
        warm, comp = onebit_phases(settings, steps)
        return [("warmup", warm), ("compressed", comp)]
    if schedule == "zero_one":
        c = zoadam_counts(settings, steps)
        return [("warmup", c["full"]), ("compressed", c["1bit"] + c["sync"]), ("local", c["local"])]
    return [("steady", steps)]


def run_bytes(config, model, world: int, settings, steps=None) -> int:
    """Bytes one rank sends over `steps` updates (default settings.steps),
    the first three updates' checks included."""
    steps = settings.steps if steps is None else steps
    sb = step_bytes(config, model, world, settings)
    checks = min(3, steps) * check_bytes(world) if world > 1 else 0
    return sum(count * getattr(sb, kind) for kind, count in phases(config, settings, steps)) + checks


def per_step_bytes(config, model, world: int, settings, update: int, kind=None) -> int:
    """Bytes of update number `update` (1-based) of a run without skipped
    steps; `kind` is 0/1 Adam's step kind when known (else simulated)."""
    sb = step_bytes(config, model, world, settings)
    extra = check_bytes(world) if world > 1 and update <= 3 else 0
    schedule = config.info.schedule
    if schedule == "freeze":
        warm, _ = onebit_phases(settings, update)
        return (sb.warmup if update <= warm else sb.compressed) + extra
    if schedule == "zero_one":
        kind = kind or zoadam_phases(settings, update)[-1]
        return {"full": sb.warmup, "1bit": sb.compressed, "sync": sb.compressed,
                "local": sb.local}[kind] + extra
    return sb.steady + extra
