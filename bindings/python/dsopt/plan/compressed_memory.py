"""Compressed ZeRO's memory per rank (docs/guides/compressed-zero.md
"Memory per rank"), kept apart from the other accountings: uncompressed
ZeRO's, with its one buffer resized, plus the gradient codec's buffers and
residuals and the parameter codec's fp32 masters; the node-aware form's
buffers instead of the codes encoded aside (docs/design/node-aware-zero.md
"Memory")."""

from . import codecs
from .layout import int8_block, zero_layout
from .network import Topology
from .zero_memory import Memory, zero_masters, zero_memory


def compressed_zero_memory(config, model, world: int, settings, rank: int, topo: Topology = None):
    """`topo`: the nodes and the form of the codes' collectives (default:
    flat); node-aware (R > 1), the gradient and the parameter codes each
    hold their own buffers (`node_aware_codes`)."""
    moments = config.info.moments
    if world == 1:
        return zero_memory(model, world, settings, rank, moments)
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size,
                      int8_block(config.parameters, settings))
    g, p = config.gradients, config.parameters
    gb = settings.gradient_block_size
    aware = topo is not None and topo.node_aware and topo.ranks_per_node > 1
    if aware and topo.world != world:
        raise ValueError(f"a topology of {topo.world} ranks for {world} ranks")
    masters = 4 * lay.shard if p != "none" else zero_masters(model, world, rank, lay)
    state = masters + 4 * moments * lay.shard
    buffer, extra = compressed_zero_buffer(config, model, world, settings, lay), 0
    if g != "none":
        # The residual holds the int8 runs of a bucket's pieces: all P
        # flat, the node-slice's N node-aware.
        pieces = topo.nodes if aware else world
        if not aware:
            extra += max(codecs.run_bytes(g, gb, max(lay.pieces)), aside_bytes(g, gb, world, lay))
        if settings.error_feedback:
            residual = sum(pieces * codecs.run_bytes("int8", gb, m) for m in lay.pieces)
            extra += 2 * residual
            state += residual
    if aware:
        extra += node_aware_codes(config, world, settings, lay, topo)
    total = masters + 4 * (moments + 1) * lay.shard + buffer + extra
    return Memory(total, state)


def node_aware_codes(config, world, settings, lay, topo) -> int:
    """docs/design/node-aware-zero.md "Memory", nodes of consecutive ranks
    (declared, or placed by node): with a gradient codec, for the largest
    bucket's piece m, the node-slice (4 N m), its codes sent and received
    (2 N R(m)) and the pieces a node's all-to-all receives (4 R m), instead
    of the flat form's codes encoded aside; with a parameter codec the
    codes of the longest chunk, this rank's, the rail's N and the node's
    R N ((1 + N + P) C(L))."""
    N, R = topo.nodes, topo.ranks_per_node
    out = 0
    if config.gradients != "none":
        m = max(lay.pieces)
        out += 4 * N * m + 2 * N * codecs.run_bytes(config.gradients, settings.gradient_block_size, m) + 4 * R * m
    if config.parameters != "none":
        out += (1 + N + world) * parameter_codes(config.parameters, settings, lay.chunk)
    return out


def parameter_codes(codec, settings, chunk) -> int:
    """C(L): a chunk's parameter codes (bf16, or int8 in blocks)."""
    return 2 * chunk if codec == "bf16" else codecs.run_bytes("int8", settings.parameter_block_size, chunk)


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
    return max(buffer, 4 * lay.chunk + (world + 1) * parameter_codes(p, settings, lay.chunk))
