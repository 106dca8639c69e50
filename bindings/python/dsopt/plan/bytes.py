"""Bytes each rank sends per step (``info.bytes_sent``), exactly as the
library counts them (docs/guides/zero.md, compressed-zero.md,
onebit-adam.md, zero-one-adam.md "Bytes"), and the average over a run for
the 1-bit family's schedules.

Every collective dsopt call starts with a 16-byte allreduce (the
handshake); an allreduce of c bytes counts 2 (P-1) c / P (rounded down),
a reduce-scatter piece or allgather chunk of c bytes (P-1) c.

Bytes across nodes (``info.bytes_inter_node``; docs/guides/multi-node.md
"Bytes"), for N nodes of R ranks (P = N R): a collective on the whole
communicator counts what its blocks would carry straight to the ranks of
other nodes (an allreduce of c bytes 2 (P-R) c / P rounded down, a piece,
chunk or all-to-all block of c bytes (P-R) c); in the node-aware form every
byte of the rail communicator crosses and none of the node communicator's."""

from dataclasses import dataclass
from functools import lru_cache

from . import codecs, paths
from .fsdp_layout import groups
from .layout import car_padded, int8_block, shard_sums, zero_layout
from .network import Topology, flat_topology


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
    return zero_exchange_bytes(model, flat_topology(world), settings, gradients, parameters)[0]


# ---- the node-aware forms (docs/guides/multi-node.md "Bytes") -------------

def car_slices(sizes, ranks_per_node: int, onebit_node: bool = False) -> list:
    """The slice of each tensor a local rank averages inside its node and
    compresses across nodes: m_t = ceil(n_t / R), or with the 1-bit node
    step (`onebit_node`) the node allreduce's chunk,
    m_t = padded_length(n_t, R) / R (NodeAwareAllreduce::slice_length)."""
    if onebit_node and ranks_per_node > 1:
        return [car_padded(n, ranks_per_node) // ranks_per_node for n in sizes]
    return [-(-n // ranks_per_node) for n in sizes]


def car_flat_cross(sizes, topo: Topology) -> int:
    """The flat 1-bit allreduce's bytes to ranks of other nodes:
    (P - R) (2 sum_t n'_t / (8P) + 8T) (NodeAwareAllreduce::flat_cross_node_bytes)."""
    P, R = topo.world, topo.ranks_per_node
    if P == 1:
        return 0
    chunk = sum(car_padded(n, P) // P // 8 for n in sizes)
    return (P - R) * (2 * chunk + 8 * len(sizes))


def car_node_aware(sizes, topo: Topology) -> tuple:
    """(node bytes, rail bytes) of one node-aware 1-bit allreduce
    (NodeAwareAllreduce::node_bytes, rail_bytes): inside the node
    (R-1) (4 sum_t m_t + sum_t n''_t / 8 + 4 N T) (the fp32 reduce-scatter,
    then the allgather of the rail's signs and scales; 2 (R-1) 4 sum_t m_t
    with one node), across nodes (N-1) (2 sum_t n''_t / (8N) + 8T),
    n''_t = padded_length(m_t, N); at R = 1 the rail allreduce runs on the
    tensors themselves. With the 1-bit node step (`topo.onebit_node`) the
    node sends instead of the fp32 reduce-scatter one chunk of signs and one
    scale per tensor to each other rank, (R-1) (sum_t m_t / 8 + 4T), on the
    slices m_t = padded_length(n_t, R) / R."""
    N, R = topo.nodes, topo.ranks_per_node
    slices = car_slices(sizes, R, topo.onebit_node)
    if N == 1:
        node = 2 * (R - 1) * 4 * sum(slices)
    else:
        reduced = sum(m // 8 for m in slices) + 4 * len(sizes) if topo.onebit_node else 4 * sum(slices)
        node = (R - 1) * (reduced + sum(car_padded(m, N) // 8 for m in slices) + 4 * N * len(sizes))
    rail = 0
    if N > 1:
        rail = (N - 1) * (2 * sum(car_padded(m, N) // N // 8 for m in slices) + 8 * len(sizes))
    return node, rail


def zero_exchange_bytes(model, topo: Topology, settings, gradients="none", parameters="none") -> tuple:
    """(bytes sent, bytes across nodes) of ZeRO's reduce-scatter and
    parameter allgather. Flat: (P-1) pieces or chunks, (P-R) of them to
    other nodes. Node-aware (a compressed half only; fp32 gradients and
    uncompressed parameters stay flat): per bucket of b elements
    (m = b / P) the fp32 reduce-scatter inside the node of the node-slice,
    (R-1) 4 N m, and the all-to-all of the node-slice's codes over the
    rail, (N-1) R(m); per allgather chunk of L elements the owners' codes
    across nodes, (N-1) C(L), then inside the node, (R-1) N C(L)."""
    P, N, R = topo.world, topo.nodes, topo.ranks_per_node
    lay = zero_layout(model.numel, P, settings.reduce_bucket_size, settings.allgather_bucket_size,
                      int8_block(parameters, settings))
    width = 2 if model.half and parameters == "none" else 4
    total = cross = 0
    grad_aware = topo.node_aware and gradients != "none"
    for m in lay.pieces:
        piece = codecs.gradient_piece_bytes(gradients, settings.gradient_block_size, m)
        if grad_aware:
            total += (R - 1) * 4 * N * m + (N - 1) * piece
            cross += (N - 1) * piece
        else:
            total += (P - 1) * piece
            cross += (P - R) * piece
    param_aware = topo.node_aware and parameters != "none"
    for c in lay.chunks:
        chunk = codecs.parameter_chunk_bytes(parameters, settings.parameter_block_size, c, width)
        if param_aware:
            total += (N - 1) * chunk + (R - 1) * N * chunk
            cross += (N - 1) * chunk
        else:
            total += (P - 1) * chunk
            cross += (P - R) * chunk
    return total, cross


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


def _sums_allreduces(config, model, world: int, settings) -> list:
    """The buffer bytes of LAMB's norm allreduces under ZeRO."""
    if not (config.zero and config.info.trust_ratio) or world == 1:
        return []
    s = shard_sums(model.sizes, zero_layout(model.numel, world, settings.reduce_bucket_size,
                                            settings.allgather_bucket_size,
                                            int8_block(config.parameters, settings)))
    return ([2 * 4 * s.cut] if s.cut else []) + [2 * 8 * s.blocks]


def sums_exchange(config, model, world: int, settings) -> int:
    """A trust-ratio rule under ZeRO (LAMB): the allreduces of its
    whole-tensor norms over ||p|| and ||u|| (`layout.shard_sums`)."""
    return sum(allreduce(world, c) for c in _sums_allreduces(config, model, world, settings))


def cross_allreduce(topo: Topology, nbytes: int) -> int:
    """An allreduce of `nbytes` on the whole communicator: 2 (P-R) c / P
    across nodes (rounded down)."""
    P = topo.world
    return 2 * (P - topo.ranks_per_node) * nbytes // P


def _step_pairs(config, model, topo: Topology, settings) -> tuple:
    """(StepBytes of bytes sent, StepBytes of bytes across nodes)."""
    world = topo.world
    if config.fsdp and world > 1:
        return paths.model_of(config).step_pairs(config, model, topo, settings)
    if world == 1:
        z = StepBytes(0, *((0, 0, 0) if config.onebit else ()))
        return z, z
    h, hx = handshake(world), cross_allreduce(topo, 16)
    overlap, overlap_x = (h, hx) if config.overlap else (0, 0)
    if config.zero:
        ex, ex_x = zero_exchange_bytes(model, topo, settings, config.gradients, config.parameters)
        sums = _sums_allreduces(config, model, world, settings)
        return (StepBytes(2 * h + ex + sum(allreduce(world, c) for c in sums) + overlap),
                StepBytes(2 * hx + ex_x + sum(cross_allreduce(topo, c) for c in sums) + overlap_x))
    full, full_x = full_allreduce(model.numel, world), cross_allreduce(topo, 4 * (model.numel + 1))
    if not config.onebit:
        return StepBytes(h + full + overlap), StepBytes(hx + full_x + overlap_x)
    warm, warm_x = h + full, hx + full_x
    car, car_x = car_pair(config, model, topo)
    comp, comp_x = 2 * h + car, 2 * hx + car_x
    if config.info.schedule == "zero_one":
        return StepBytes(2 * h, warm, comp, 2 * h), StepBytes(2 * hx, warm_x, comp_x, 2 * hx)
    return StepBytes(comp, warm, comp), StepBytes(comp_x, warm_x, comp_x)


def car_pair(config, model, topo: Topology) -> tuple:
    """(bytes sent, bytes across nodes) per rank of one call of the 1-bit
    family's compressed allreduce, in the topology's form."""
    sizes = car_sizes(config, model, topo.world)
    if topo.node_aware:
        node, rail = car_node_aware(sizes, topo)
        return node + rail, rail
    return compressed_allreduce(sizes, topo.world), car_flat_cross(sizes, topo)


def step_bytes(config, model, world: int, settings, topo: Topology = None) -> StepBytes:
    """Bytes per rank of the steps after the third (the first three add a
    16-byte check of the gradients' hashes, `check_bytes`); `topo`: the
    nodes and the form of the compressed collectives (default: flat)."""
    return _step_pairs(config, model, topo or flat_topology(world), settings)[0]


def step_cross_bytes(config, model, topo: Topology, settings) -> StepBytes:
    """Bytes per rank across node boundaries of the steps after the third
    (``info.bytes_inter_node``)."""
    return _step_pairs(config, model, topo, settings)[1]


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


def run_bytes(config, model, world: int, settings, steps=None, topo: Topology = None, cross=False) -> int:
    """Bytes one rank sends over `steps` updates (default settings.steps),
    the first three updates' checks included (`cross`: those across nodes)."""
    steps = settings.steps if steps is None else steps
    topo = topo or flat_topology(world)
    sb = _step_pairs(config, model, topo, settings)[1 if cross else 0]
    if config.fsdp:  # the check runs over dsopt's communicator: the replicas (across nodes), if any
        replicas = groups(config, topo)[1]
        checks = min(3, steps) * check_bytes(replicas) if replicas > 1 else 0
    else:
        checks = min(3, steps) * (cross_allreduce(topo, 16) if cross else check_bytes(world)) if world > 1 else 0
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
