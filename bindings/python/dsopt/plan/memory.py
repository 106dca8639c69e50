"""Memory per rank (``dsopt_memory_usage`` host bytes of a CPU optimizer,
device bytes of a CUDA one) and its state part
(``dsopt_state_memory_usage``), as the library allocates it in a run's
steady state: after the first step, and for 1-bit Adam/LAMB once the
compression stage has begun. The caller's parameters and gradients are not
counted. Uncompressed ZeRO's accounting is `zero_memory.py`, compressed
ZeRO's `compressed_memory.py`."""

from . import paths
from .allreduce_memory import car_memory
from .compressed_memory import aside_bytes, compressed_zero_memory
from .layout import car_padded, int8_block, shard_sums, zero_layout
from .network import Topology, flat_topology
from .zero_memory import Memory, zero_memory


KEPT_BUFFERS = 3  # ZeRO waits for a reduction rather than make a 4th bucket buffer


def handover_buffers(sizes, layout, concurrent_comm: bool) -> int:
    """How many bucket buffers ZeRO's gradient path holds when the
    gradients are handed over during backward (in reverse parameter order)
    with one micro-batch per step, as src/zero/gradient_reducer.cpp makes
    them: a bucket gets a buffer when its first gradient arrives; a complete
    bucket is reduced once every bucket after it has been (last to first),
    and its buffer is free again when that reduction has finished. With
    no free buffer a new one is made, unless three exist and a reduction
    is in flight: then dsopt waits for the oldest. A communicator without
    concurrent calls finishes each reduction inside the hand-over call; on
    dsopt's thread (concurrent) how many are made depends on the timing,
    and this returns the most: no reduction finishing before it is waited
    for. The buffers are kept from step to step."""
    bucket = layout.bucket
    missing = [b for b in layout.buckets]
    numel = sum(sizes)
    # Padding past the last parameter needs no gradient.
    missing[-1] -= layout.padded - numel
    pool, free, assigned, in_flight = 0, [], {}, []
    next_reduce = len(layout.buckets) - 1
    end = numel
    for n in reversed(sizes):
        lo, hi = end - n, end
        end = lo
        for k in range(lo // bucket, (hi - 1) // bucket + 1):
            b0, b1 = k * bucket, min((k + 1) * bucket, layout.padded)
            if k not in assigned:
                if not concurrent_comm:
                    free += in_flight
                    in_flight = []
                if not free and pool >= KEPT_BUFFERS and in_flight:
                    free.append(in_flight.pop(0))
                if not free:
                    free.append(pool)
                    pool += 1
                assigned[k] = free.pop()
            missing[k] -= min(b1, hi) - max(b0, lo)
        while next_reduce >= 0 and missing[next_reduce] == 0 and next_reduce in assigned:
            in_flight.append(assigned.pop(next_reduce))
            next_reduce -= 1
    return pool


def overlap_buffers(config, model, world: int, settings, concurrent_comm: bool) -> int:
    """Bytes of the bucket buffers that handing gradients over adds to
    ZeRO's one buffer (`handover_buffers` in all, the first being that
    buffer): each holds a bucket in fp32 (4 B), or codes received aside."""
    if not config.overlap or not config.zero or world == 1:
        return 0
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size)
    buffer = 4 * lay.bucket
    if config.codecs and config.gradients != "none":
        buffer = max(buffer, aside_bytes(config.gradients, settings.gradient_block_size, world, lay))
    return (handover_buffers(model.sizes, lay, concurrent_comm) - 1) * buffer


def trust_ratio_buffers(config, model, world: int, settings) -> int:
    """A trust-ratio rule under ZeRO (LAMB): its update u over the shard,
    and the cut sum blocks of p and u rebuilt for the whole-tensor norms
    (`layout.shard_sums`, made at the first step)."""
    if not config.info.trust_ratio:
        return 0
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size,
                      int8_block(config.parameters, settings))
    return 4 * lay.shard + 2 * 4 * shard_sums(model.sizes, lay).cut


def memory(config, model, world: int, settings, rank: int = None, overlapping_comm: bool = True,
           concurrent_comm: bool = True, topo: Topology = None) -> Memory:
    """Memory of `rank` (default: the rank that holds most). `overlapping_comm`:
    the communicator overlaps transfers (MPI on host buffers), so the 1-bit
    compressed allreduce is cut into pieces; `concurrent_comm`: it may be
    called from dsopt's thread (overlap's buffers, `overlap_buffers`);
    `topo`: the nodes and the form of the compressed collectives (default:
    flat), whose node-aware forms hold other buffers (the 1-bit allreduce's,
    `allreduce_memory.py`; compressed ZeRO's, `compressed_memory.py`)."""
    if config.fsdp:
        return paths.model_of(config).memory(config, model, topo or flat_topology(world), settings, overlapping_comm)
    if rank is None:
        # The padding sits at the end of each bucket, so rank 0 holds the
        # most real elements (fp32 masters of 16-bit parameters): the most memory.
        rank = 0
    n = model.numel
    masters = 4 * n if model.half else 0
    averaged = 4 * (n + 1) if world > 1 else 0
    alg = config.info
    if not config.zero and not alg.compressed:
        # A moment rule keeps `moments` fp32 arrays per element. Handed-over
        # gradients are packed into the averaged gradient's buffer, which
        # one rank holds then too. A trust-ratio rule (LAMB) holds its
        # update u besides.
        state = masters + 4 * alg.moments * n
        u = 4 * n if alg.trust_ratio else 0
        return Memory(state + u + (4 * (n + 1) if config.overlap else averaged), state)
    if config.zero:
        m = (compressed_zero_memory(config, model, world, settings, rank, topo) if config.codecs
             else zero_memory(model, world, settings, rank, alg.moments))
        m = Memory(m.total + trust_ratio_buffers(config, model, world, settings), m.state)
    elif alg.schedule == "zero_one":
        # m, v, the accumulator and the last sync's parameters; the
        # compressed allreduce exists from creation.
        car = car_memory(model.sizes, world, overlapping_comm, topo)
        held = masters + 16 * n
        m = Memory(held + car.errors + averaged + car.buffers, held + car.state)
    elif alg.trust_ratio:
        # 1-bit LAMB: m over the fused, padded buffer; v, the fresh
        # variance, u, the auxiliary and ratio buffers over n (the state:
        # m, v and fresh v; m's padding tail joins it in the compression
        # stage). The allreduce runs over the one fused tensor.
        padded = car_padded(n, world) if world > 1 else n
        car = car_memory([padded], world, overlapping_comm, topo)
        held = masters + 4 * padded + 20 * n + averaged
        state = masters + 12 * n + car.state + 4 * (padded - n)
        m = Memory(held + car.errors + car.buffers, state, held)
    else:
        # 1-bit Adam: its moments, and the compressed allreduce's errors
        # and buffers from the compression stage on.
        car = car_memory(model.sizes, world, overlapping_comm, topo)
        state = masters + 4 * alg.moments * n
        m = Memory(state + car.errors + averaged + car.buffers, state + car.state, state + averaged)
    extra = overlap_buffers(config, model, world, settings, concurrent_comm)
    return Memory(m.total + extra, m.state, m.warmup + extra)
