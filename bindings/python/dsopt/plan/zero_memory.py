"""Uncompressed ZeRO-1/2's memory per rank, and the record of memory per
rank every accounting returns (`memory.py` and `compressed_memory.py`
build on both)."""

from dataclasses import dataclass

from .layout import zero_layout


@dataclass(frozen=True)
class Memory:
    total: int      # dsopt_memory_usage
    state: int      # dsopt_state_memory_usage: what the blob saves
    warmup: int = None  # 1-bit Adam/LAMB before the compression stage
    caller: int = None  # FSDP2: the caller's parameters and gradients on the rank (`fsdp.py`);
                        # None: the whole model's, every rank holding them

    def __post_init__(self):
        if self.warmup is None:
            object.__setattr__(self, "warmup", self.total)


def shard_real_elements(numel: int, world: int, rank: int, layout) -> int:
    """Elements of rank `rank`'s shard that are parameters, not padding."""
    real, start = 0, 0
    for b in layout.buckets:
        m = b // world
        lo = start + rank * m
        real += max(0, min(lo + m, numel) - lo)
        start += b
    return real


def zero_masters(model, world, rank, layout):
    """fp32 masters of the shard's 16-bit elements."""
    return 4 * shard_real_elements(model.numel, world, rank, layout) if model.half else 0


def zero_memory(model, world: int, settings, rank: int, moments: int = 2) -> Memory:
    """Uncompressed ZeRO-1/2 (docs/guides/zero.md "Memory per rank") of a
    moment rule keeping `moments` fp32 arrays per shard element."""
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size)
    state = zero_masters(model, world, rank, lay) + 4 * moments * lay.shard
    if world == 1:
        return Memory(state + 4 * lay.shard, state)
    return Memory(state + 4 * lay.shard + zero_buffer(model, world, lay), state)


def zero_buffer(model, world, lay) -> int:
    """The one buffer: a reduce bucket in fp32, then every rank's allgather
    chunk in the parameters' bytes."""
    width = 2 if model.half else 4
    return max(4 * lay.bucket, width * lay.chunk * (world + 1))
