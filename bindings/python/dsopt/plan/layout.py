"""The element layouts that bytes and memory follow, as the library cuts
them: ZeRO's flat range (docs/guides/zero.md "Layout") and the padding and
pieces of the 1-bit compressed allreduce (docs/optimizers/onebit-adam.md)."""

from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from math import gcd

SUM_BLOCK = 4096        # elements per sum block of the compressed allreduce
MIN_PIECE_BLOCKS = 64   # a piece holds at least this many sum blocks ...
MAX_PIECES = 32         # ... and a call at most this many pieces


@dataclass(frozen=True)
class ZeroLayout:
    world: int
    padded: int          # n': the element count padded to a multiple of 2P
    bucket: int          # B: reduce bucket elements (a multiple of 2P)
    buckets: tuple       # the element count of every reduce bucket
    shard: int           # S = n'/P
    chunk: int           # L: allgather chunk per rank
    chunks: tuple        # the element count of every allgather chunk of the shard

    @property
    def pieces(self):
        """Each bucket's piece per rank, m = bucket / P."""
        return tuple(b // self.world for b in self.buckets)


def int8_block(parameters: str, settings):
    """The int8 parameter codec's block (its chunks are whole blocks), or
    None for the other parameter codecs."""
    return settings.parameter_block_size if parameters == "int8" else None


def zero_layout(numel: int, world: int, reduce_bucket_size: int, allgather_bucket_size: int,
                int8_block: int = None) -> ZeroLayout:
    """The layout for these sizes; ``int8_block``: the int8 parameter
    codec's block, to which its allgather chunks are rounded down (at least
    one block)."""
    unit = 2 * world
    padded = -(-numel // unit) * unit
    bucket = max(unit, reduce_bucket_size // unit * unit)
    bucket = min(bucket, padded)
    full, rest = divmod(padded, bucket)
    buckets = (bucket,) * full + ((rest,) if rest else ())
    shard = padded // world
    chunk = max(1, allgather_bucket_size // world)
    if int8_block:
        chunk = max(int8_block, chunk // int8_block * int8_block)
    chunk = min(shard, chunk)
    cfull, crest = divmod(shard, chunk)
    chunks = (chunk,) * cfull + ((crest,) if crest else ())
    return ZeroLayout(world, padded, bucket, buckets, shard, chunk, chunks)


def car_padded(n: int, world: int) -> int:
    """DeepSpeed's n': n rounded up to a multiple of P * lcm(P, 8)."""
    unit = world * (8 * world // gcd(world, 8))
    return n if n % unit == 0 else n + unit - n % unit


def car_message_bytes(sizes, world: int) -> int:
    """Bytes of signs one rank sends to each rank: sum of n'/P/8."""
    return sum(car_padded(n, world) // world // 8 for n in sizes)


def car_largest_piece(sizes, world: int, overlapping: bool) -> tuple:
    """(pieces, bytes of the largest piece) of one compressed allreduce:
    a communicator that overlaps transfers (MPI on host buffers) cuts it
    into up to 32 pieces of at least 64 sum blocks each; others run one."""
    # Sum blocks of each tensor's chunk (n'/P elements): full blocks of
    # 4096 elements, the last one shorter.
    counts, lasts = [], []
    for n in sizes:
        c = car_padded(n, world) // world
        counts.append(-(-c // SUM_BLOCK))
        lasts.append(c - (counts[-1] - 1) * SUM_BLOCK)
    blocks = sum(counts)
    if overlapping:
        per_piece = max(MIN_PIECE_BLOCKS, -(-blocks // MAX_PIECES))
    else:
        per_piece = max(blocks, 1)
    # Bytes of the first k blocks, through per-tensor prefix sums.
    starts, before = [], []
    k_acc, b_acc = 0, 0
    for cnt, last in zip(counts, lasts):
        starts.append(k_acc)
        before.append(b_acc)
        k_acc += cnt
        b_acc += (cnt - 1) * SUM_BLOCK // 8 + last // 8

    def bytes_of_first(k):
        if k >= blocks:
            return b_acc
        t = bisect_right(starts, k) - 1
        j = k - starts[t]          # whole blocks of tensor t before k, all full (j < counts[t])
        return before[t] + j * SUM_BLOCK // 8

    pieces = -(-blocks // per_piece)
    largest = max(bytes_of_first(min(blocks, (i + 1) * per_piece)) - bytes_of_first(i * per_piece)
                  for i in range(pieces))
    return pieces, largest


@dataclass(frozen=True)
class ShardSums:
    """LAMB's whole-tensor norms under ZeRO (src/zero/shard_tensor_sums.cpp):
    every tensor is cut into sum blocks of SUM_BLOCK elements from its
    start; a block some rank holds whole is summed there, one the shards
    cut (a bucket's piece boundary falls inside it) is rebuilt on every
    rank by an allreduce of `cut` fp32 elements per stream, and one
    allreduce of `blocks` fp64 sums per stream gives every rank all sums."""
    blocks: int
    cut: int


def shard_sums(sizes, layout) -> ShardSums:
    return _shard_sums(tuple(sizes), layout.world, layout.buckets)


@lru_cache(maxsize=256)
def _shard_sums(sizes, world, buckets) -> ShardSums:
    starts, flat = [], 0
    for n in sizes:
        starts.append(flat)
        flat += n
    blocks = sum(-(-n // SUM_BLOCK) for n in sizes)
    cut_blocks = set()
    at = 0
    for b in buckets:
        piece = b // world
        for k in range(world + 1):
            c = at + k * piece
            if 0 < c < flat:
                t = bisect_right(starts, c) - 1
                off = c - starts[t]
                if off % SUM_BLOCK:
                    cut_blocks.add((t, off // SUM_BLOCK))
        at += b
    cut = sum(min(SUM_BLOCK, sizes[t] - k * SUM_BLOCK) for t, k in cut_blocks)
    return ShardSums(blocks, cut)
