"""The collectives each kind of step issues, with their sizes: the same
traffic `bytes.py` counts, as calls the network model can time
(docs/guides/communicators.md "Cost")."""

from dataclasses import dataclass

from . import codecs
from .bytes import car_sizes
from .layout import car_message_bytes, int8_block, shard_sums, zero_layout


@dataclass(frozen=True)
class Call:
    op: str          # "allreduce", "reduce_scatter", "allgather", "alltoall"
    nbytes: int      # allreduce: the buffer; reduce_scatter/allgather: every rank's blocks; alltoall: what one rank sends
    stage: str       # "grad": reduces gradients (may run behind backward, one per bucket);
                     # "control": small agreement; "post": after the update (parameter allgather)
    bucket: int = -1         # gradient bucket (parameter order) for "grad"
    share: float = 1.0       # the bucket's share of the gradient elements


def _handshake():
    return Call("allreduce", 16, "control")


def _car(sizes, world):
    """The 1-bit compressed allreduce: the signs to every rank, the server's
    recompressed signs back, and one scale per tensor each way."""
    msg = car_message_bytes(sizes, world)
    return [Call("alltoall", world * msg, "grad", 0), Call("allgather", world * msg, "grad", 0),
            Call("allgather", 4 * len(sizes) * world, "control"), Call("allgather", 4 * len(sizes) * world, "control")]


def _buckets(numel, world, settings):
    """Stage 0's reduce buckets when gradients are handed over."""
    size = max(1, settings.reduce_bucket_size)
    out, start = [], 0
    while start < numel:
        out.append(min(size, numel - start))
        start += size
    return out


def step_calls(config, model, world: int, settings, kind="steady") -> list:
    """The calls of one step (`kind`: "steady", or the 1-bit family's
    "warmup", "compressed", "local")."""
    if world == 1:
        return []
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
            calls.append(Call("allgather", world * size, "post"))
        return calls
    calls.append(Call("allreduce", 16, "control"))
    if kind == "local":
        return calls
    return calls + _car(car_sizes(config, model, world), world)


def comm_time(calls, cluster) -> float:
    return sum(getattr(cluster, c.op)(c.nbytes) for c in calls)
