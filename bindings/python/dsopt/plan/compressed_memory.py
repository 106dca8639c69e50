"""Compressed ZeRO's memory per rank (docs/guides/compressed-zero.md
"Memory per rank"), kept apart from the other accountings: uncompressed
ZeRO's, with its one buffer resized, plus the gradient codec's buffers and
residuals and the parameter codec's fp32 masters."""

from . import codecs
from .layout import int8_block, zero_layout
from .zero_memory import Memory, zero_masters, zero_memory


def compressed_zero_memory(config, model, world: int, settings, rank: int):
    moments = config.info.moments
    if world == 1:
        return zero_memory(model, world, settings, rank, moments)
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size,
                      int8_block(config.parameters, settings))
    g, p = config.gradients, config.parameters
    gb = settings.gradient_block_size
    masters = 4 * lay.shard if p != "none" else zero_masters(model, world, rank, lay)
    state = masters + 4 * moments * lay.shard
    buffer, extra = compressed_zero_buffer(config, model, world, settings, lay), 0
    if g != "none":
        aside = aside_bytes(g, gb, world, lay)
        extra += max(codecs.run_bytes(g, gb, max(lay.pieces)), aside)
        if settings.error_feedback:
            residual = sum(world * codecs.run_bytes("int8", gb, m) for m in lay.pieces)
            extra += 2 * residual
            state += residual
    total = masters + 4 * (moments + 1) * lay.shard + buffer + extra
    return Memory(total, state)


def aside_bytes(codec, block, world, lay) -> int:
    """Pieces whose codes outgrow their gradients (R(m) > 2 m) are encoded
    aside, into P R(m) bytes for the largest such piece."""
    return max([world * codecs.run_bytes(codec, block, m) for m in lay.pieces
                if codecs.run_bytes(codec, block, m) > 2 * m], default=0)


def compressed_zero_buffer(config, model, world, settings, lay) -> int:
    """The one buffer: a reduce bucket (4 B), the codes received aside, and
    an allgather chunk: every rank's parameters (w L (P + 1)) or, with a
    parameter codec, a decoded chunk and every rank's codes
    (4 L + (P + 1) C(L))."""
    g, p = config.gradients, config.parameters
    buffer = 4 * lay.bucket
    if g != "none":
        buffer = max(buffer, aside_bytes(g, settings.gradient_block_size, world, lay))
    if p == "none":
        width = 2 if model.half else 4
        return max(buffer, width * lay.chunk * (world + 1))
    coded = 2 * lay.chunk if p == "bf16" else codecs.run_bytes("int8", settings.parameter_block_size, lay.chunk)
    return max(buffer, 4 * lay.chunk + (world + 1) * coded)
