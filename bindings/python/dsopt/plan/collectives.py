"""The collectives each kind of step issues, with their sizes: the same
traffic `bytes.py` counts, as calls the network model can time
(docs/guides/communicators.md "Cost")."""

from dataclasses import dataclass

from . import paths
from . import codecs
from .bytes import car_sizes, car_slices
from .layout import car_message_bytes, int8_block, shard_sums, zero_layout
from .network import Topology, flat_topology


@dataclass(frozen=True)
class Call:
    op: str          # "allreduce", "reduce_scatter", "allgather", "alltoall"
    nbytes: int      # allreduce: the buffer; reduce_scatter/allgather: every rank's blocks; alltoall: what one rank sends
    stage: str       # "grad": reduces gradients (may run behind backward, one per bucket);
                     # "control": small agreement; "post": after the update (parameter allgather)
    bucket: int = -1         # gradient bucket (parameter order) for "grad"
    share: float = 1.0       # the bucket's share of the gradient elements
    level: str = "world"     # the communicator: "world", or the node-aware form's "node" and "rail"


def _handshake():
    return Call("allreduce", 16, "control")


def _car(sizes, world, level="world"):
    """The 1-bit compressed allreduce: the signs to every rank, the server's
    recompressed signs back, and one scale per tensor each way."""
    msg = car_message_bytes(sizes, world)
    return [Call("alltoall", world * msg, "grad", 0, level=level),
            Call("allgather", world * msg, "grad", 0, level=level),
            Call("allgather", 4 * len(sizes) * world, "control", level=level),
            Call("allgather", 4 * len(sizes) * world, "control", level=level)]


def _car_node_aware(sizes, topo):
    """The node-aware 1-bit allreduce: the fp32 reduce-scatter inside the
    node, the flat one over the rail on the slices, then inside the node
    the allgather of the rail's result as it arrived (signs and scales; the
    fp32 slices with one node). The 1-bit node step (`topo.onebit_node`)
    reduces inside the node with the first half of the 1-bit allreduce over
    the node instead: its signs to their owners (an all-to-all) and the
    worker scales."""
    N, R = topo.nodes, topo.ranks_per_node
    if R == 1:
        return _car(sizes, N, "rail")
    slices = car_slices(sizes, R, topo.onebit_node)
    block = 4 * sum(slices)
    if topo.onebit_node:
        inside = _car(sizes, R, "node")[:1] + [Call("allgather", 4 * len(sizes) * R, "control", level="node")]
    else:
        inside = [Call("reduce_scatter", R * block, "grad", 0, level="node")]
    if N == 1:
        return inside + [Call("allgather", R * block, "grad", 0, level="node")]
    codes = N * car_message_bytes(slices, N)
    return inside + _car(slices, N, "rail") + [Call("allgather", R * codes, "grad", 0, level="node"),
                                               Call("allgather", R * 4 * N * len(sizes), "control", level="node")]


def _buckets(numel, world, settings):
    """Stage 0's reduce buckets when gradients are handed over."""
    size = max(1, settings.reduce_bucket_size)
    out, start = [], 0
    while start < numel:
        out.append(min(size, numel - start))
        start += size
    return out


def step_calls(config, model, world: int, settings, kind="steady", topo: Topology = None) -> list:
    """The calls of one step (`kind`: "steady", or the 1-bit family's
    "warmup", "compressed", "local"); `topo`: the nodes and the form of the
    compressed collectives (default: flat)."""
    if world == 1:
        return []
    topo = topo or flat_topology(world)
    if config.fsdp:
        return paths.model_of(config).calls(config, model, topo, settings, kind)
    N, R = topo.nodes, topo.ranks_per_node
    n = model.numel
    calls = [_handshake()]
    if not (config.zero or config.onebit) or kind == "warmup":
        if config.overlap:
            calls.append(_handshake())
            bs = _buckets(n, world, settings)
            calls += [Call("allreduce", 4 * b + (4 if i == len(bs) - 1 else 0), "grad", i, b / n)
                      for i, b in enumerate(bs)]
        else:
            calls.append(Call("allreduce", 4 * (n + 1), "grad", 0))
        return calls
    if config.zero:
        if config.overlap:
            calls.append(_handshake())
        lay = zero_layout(n, world, settings.reduce_bucket_size, settings.allgather_bucket_size,
                          int8_block(config.parameters, settings))
        width = 2 if model.half and config.parameters == "none" else 4
        for i, b in enumerate(lay.buckets):
            m = b // world
            if config.gradients == "none":
                calls.append(Call("reduce_scatter", 4 * b, "grad", i, b / lay.padded))
            elif topo.node_aware:
                # The node-slice (N pieces) reduced in fp32 inside the node,
                # then its codes to the owners over the rail.
                piece = codecs.gradient_piece_bytes(config.gradients, settings.gradient_block_size, m)
                if R > 1:
                    calls.append(Call("reduce_scatter", 4 * b, "grad", i, b / lay.padded, level="node"))
                if N > 1:
                    calls.append(Call("alltoall", N * piece, "grad", i, 0.0 if R > 1 else b / lay.padded,
                                      level="rail"))
            else:
                piece = codecs.gradient_piece_bytes(config.gradients, settings.gradient_block_size, m)
                calls.append(Call("alltoall", world * piece, "grad", i, b / lay.padded))
        calls.append(Call("allreduce", 16, "control"))
        if config.info.trust_ratio:
            # LAMB's whole-tensor norms of p and u (bytes.sums_exchange).
            sums = shard_sums(model.sizes, lay)
            if sums.cut:
                calls.append(Call("allreduce", 2 * 4 * sums.cut, "post"))
            calls.append(Call("allreduce", 2 * 8 * sums.blocks, "post"))
        for c in lay.chunks:
            size = codecs.parameter_chunk_bytes(config.parameters, settings.parameter_block_size, c, width)
            if topo.node_aware and config.parameters != "none":
                # The owners' codes across nodes first, then inside the node.
                if N > 1:
                    calls.append(Call("allgather", N * size, "post", level="rail"))
                if R > 1:
                    calls.append(Call("allgather", R * N * size, "post", level="node"))
            else:
                calls.append(Call("allgather", world * size, "post"))
        return calls
    calls.append(Call("allreduce", 16, "control"))
    if kind == "local":
        return calls
    sizes = car_sizes(config, model, world)
    return calls + (_car_node_aware(sizes, topo) if topo.node_aware else _car(sizes, world))


def call_time(call, cluster) -> float:
    return cluster.call(call.op, call.nbytes, call.level)


def comm_time(calls, cluster) -> float:
    return sum(call_time(c, cluster) for c in calls)
