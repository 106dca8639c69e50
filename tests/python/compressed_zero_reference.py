"""Numpy reference of compressed ZeRO (docs/guides/compressed-zero.md),
written from the guide, not from the C++: the block codecs bit for bit,
and the gradient path of P ranks (the flat layout and its reduce buckets,
each rank's residual in int8 blocks, the decoded pieces summed in rank
order).

A codec turns an fp32 run into (scales, levels); ``decode`` turns them
back into fp32. ``encode_bytes`` gives the wire bytes too, so the record
layout is checked as well as the values."""

import numpy as np

F32 = np.float32
BITS = {"int8": 8, "int4": 4, "sign": 1}
LIMIT = {"int8": 127, "int4": 7}


def record_bytes(codec, block):
    return 4 + block * BITS[codec] // 8


def run_bytes(codec, block, n):
    return -(-n // block) * record_bytes(codec, block)


def _scale(codec, x):
    if not np.all(np.isfinite(x)):
        return F32(np.nan)
    a = np.abs(x)
    if codec == "sign":
        total = np.cumsum(a.astype(np.float64))[-1] if len(a) else 0.0
        return F32(total / len(a)) if len(a) else F32(0)
    s = F32(F32(a.max()) / F32(LIMIT[codec]))
    with np.errstate(over="ignore"):
        if not np.isfinite(F32(LIMIT[codec]) * s):  # the top level would decode to Inf
            s = np.nextafter(s, F32(0))
    return s


def _levels(codec, x, s):
    if codec == "sign":
        return (x < 0).astype(np.int64)
    if not (s > 0) or not np.isfinite(s):
        return np.zeros(len(x), np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint(x / s)
    return np.clip(q, -LIMIT[codec], LIMIT[codec]).astype(np.int64)


def _values(codec, q, s):
    if codec == "sign":
        return np.where(q == 1, -s, s).astype(F32)
    with np.errstate(invalid="ignore"):
        return (q.astype(F32) * s).astype(F32)


def encode(codec, block, x):
    """x: fp32 run. Returns (bytes, decoded values) of the run."""
    x = np.asarray(x, F32)
    out, decoded = bytearray(), []
    for b in range(0, len(x), block):
        xb = x[b:b + block]
        s = _scale(codec, xb)
        q = _levels(codec, xb, s)
        payload = np.zeros(block * BITS[codec] // 8, np.uint8)
        if codec == "int8":
            payload[:len(q)] = q.astype(np.int8).view(np.uint8)
        elif codec == "int4":
            nib = np.zeros(block, np.uint8)
            nib[:len(q)] = (q & 0xF).astype(np.uint8)
            payload[:] = nib[0::2] | (nib[1::2] << 4)
        else:
            bit = np.zeros(block, np.uint8)
            bit[:len(q)] = q
            payload[:] = np.packbits(bit.reshape(-1, 8), axis=1, bitorder="little").ravel()
        out += np.array([s], F32).tobytes() + payload.tobytes()
        decoded.append(_values(codec, q, s))
    return bytes(out), (np.concatenate(decoded) if decoded else np.zeros(0, F32))


def decode(codec, block, data, n):
    """The values of an encoded run of n elements."""
    rec = record_bytes(codec, block)
    out = []
    for k, b in enumerate(range(0, n, block)):
        r = data[k * rec:(k + 1) * rec]
        s = np.frombuffer(r[:4], F32)[0]
        payload = np.frombuffer(r[4:], np.uint8)
        length = min(block, n - b)
        if codec == "int8":
            q = payload.view(np.int8)[:length].astype(np.int64)
        elif codec == "int4":
            nib = np.empty(block, np.int64)
            nib[0::2], nib[1::2] = payload & 0xF, payload >> 4
            q = np.where(nib >= 8, nib - 16, nib)[:length]
        else:
            q = np.unpackbits(payload, bitorder="little")[:length].astype(np.int64)
        out.append(_values(codec, q, s))
    return np.concatenate(out) if out else np.zeros(0, F32)


def int8_residual(block, lost):
    """The residual kept of what an encoding lost: its int8 encoding in
    blocks of the codec's size, decoded."""
    return encode("int8", block, lost)[1]


def with_feedback(codec, block, g, e, residual=int8_residual):
    """Encodes x = fl(g + e) (e None: no feedback); returns (decoded, new e),
    the new e being residual(block, fl(x - x'))."""
    x = np.asarray(g, F32) if e is None else (np.asarray(g, F32) + e).astype(F32)
    _, d = encode(codec, block, x)
    if e is None:
        return d, None
    with np.errstate(invalid="ignore"):
        return d, residual(block, (x - d).astype(F32))


# ---- the layout ------------------------------------------------------------

def buckets(sizes, world, bucket_elems):
    """(flat_start, numel) of every reduce bucket and the padded length n'."""
    n = sum(sizes)
    padded = -(-n // (2 * world)) * (2 * world)
    b = max(2 * world, bucket_elems // (2 * world) * (2 * world))
    out = [(s, min(b, padded - s)) for s in range(0, padded, b)]
    return out, padded


class GradientPath:
    """The compressed reduce-scatter of P ranks over the flat layout: each
    reduction returns the decoded sum of every bucket piece (flat order,
    n' elements), which is what lands in each owner's shard."""

    def __init__(self, sizes, world, bucket_elems, codec, block, feedback, residual=int8_residual):
        self.world, self.codec, self.block, self.residual = world, codec, block, residual
        self.buckets, self.padded = buckets(sizes, world, bucket_elems)
        self.n = sum(sizes)
        self.e = [np.zeros(self.padded, F32) if feedback else None for _ in range(world)]
        self.scale = 1.0  # the loss scale the residuals are in

    def flat(self, grads):
        out = np.zeros(self.padded, F32)
        out[:self.n] = np.concatenate([np.asarray(g, F32).ravel() for g in grads])
        return out

    def reduce(self, flats, residuals):
        """flats[r]: rank r's packed fp32 gradient. Updates residuals in
        place; returns the decoded sums in flat order."""
        total = np.zeros(self.padded, F32)
        for start, numel in self.buckets:
            piece = numel // self.world
            for owner in range(self.world):
                lo = start + owner * piece
                acc = None
                for r in range(self.world):
                    e = None if residuals[r] is None else residuals[r][lo:lo + piece]
                    d, e2 = with_feedback(self.codec, self.block, flats[r][lo:lo + piece], e,
                                          self.residual)
                    if e2 is not None:
                        residuals[r][lo:lo + piece] = e2
                    acc = d.copy() if acc is None else (acc + d).astype(F32)
                total[lo:lo + piece] = acc
        return total

    def step(self, per_rank_grads, commit=True, scale=1.0):
        """One reduction of every rank's gradients, made with loss scale
        ``scale``; residuals made under another scale enter it multiplied
        by fl(new / old). The residuals (and their scale) keep the update
        only when ``commit`` (a step that is not skipped)."""
        mul = F32(scale / self.scale)
        work = [None if e is None else (e * mul).astype(F32) for e in self.e]
        total = self.reduce([self.flat(g) for g in per_rank_grads], work)
        if commit:
            self.e, self.scale = work, scale
        return total



class NodeAwarePath(GradientPath):
    """The node-aware gradient path (docs/design/node-aware-zero.md) of P =
    N R ranks, rank r = (node r // R, local r % R): each bucket's pieces
    summed in fp32 inside the node in the communicator's fixed order (for
    local rank j's block: x[j+1] + x[j+2] + ... + x[j], local indices mod R,
    one rounding per addition); local rank j encodes, with its residual,
    the node sums of the N pieces owned by the ranks of local index j (its
    node-slice); each owner sums the N decoded pieces in node order. A
    rank's residual is N int8 pieces per bucket: n'/R values, bucket by
    bucket (bucket at flat_start / R), node by node."""

    def __init__(self, sizes, world, per_node, bucket_elems, codec, block, feedback,
                 residual=int8_residual):
        super().__init__(sizes, world, bucket_elems, codec, block, feedback, residual)
        assert world % per_node == 0
        self.per_node, self.nodes = per_node, world // per_node
        self.e = [np.zeros(self.padded // per_node, F32) if feedback else None for _ in range(world)]

    def reduce(self, flats, residuals):
        R, N = self.per_node, self.nodes
        total = np.zeros(self.padded, F32)
        for start, numel in self.buckets:
            m = numel // self.world
            at = start // R
            decoded = {}
            for k in range(N):
                for j in range(R):
                    r = k * R + j
                    for kk in range(N):
                        lo = start + (kk * R + j) * m
                        s = flats[k * R + (j + 1) % R][lo:lo + m].copy()
                        for t in range(2, R + 1):
                            s = (s + flats[k * R + (j + t) % R][lo:lo + m]).astype(F32)
                        e = None if residuals[r] is None else residuals[r][at + kk * m:at + (kk + 1) * m]
                        d, e2 = with_feedback(self.codec, self.block, s, e, self.residual)
                        if e2 is not None:
                            residuals[r][at + kk * m:at + (kk + 1) * m] = e2
                        decoded[(kk * R + j, k)] = d
            for owner in range(self.world):
                lo = start + owner * m
                acc = decoded[(owner, 0)].copy()
                for k in range(1, N):
                    acc = (acc + decoded[(owner, k)]).astype(F32)
                total[lo:lo + m] = acc
        return total


def step_bytes(sizes, world, per_node, bucket_elems, chunk_elems, grads, params, block, param_block,
               wire, node_aware):
    """(bytes_sent, bytes_inter_node) of one step of a rank (every rank
    alike) on N = P / R nodes of R ranks (rank r on node r // R), flat or
    node-aware (docs/design/node-aware-zero.md "Bytes"): the handshake and
    the status/norm allreduce of 16 bytes each, every reduce bucket, every
    allgather chunk. ``wire``: bytes per element of the uncompressed
    allgather (4, or 2 when every parameter is 16-bit)."""
    P, R = world, per_node
    N = P // R

    # The two 16-byte allreduces: 2 (P-1) c / P sent, 2 (P-R) c / P of it
    # off the node (pairwise, rounded down).
    sent, inter = 2 * (2 * (P - 1) * 16 // P), 2 * (2 * (P - R) * 16 // P)
    bucket_list, padded = buckets(sizes, world, bucket_elems)
    for _, numel in bucket_list:
        m = numel // P
        if grads == "none":
            sent, inter = sent + (P - 1) * 4 * m, inter + (P - R) * 4 * m
        elif node_aware and R > 1:
            run = run_bytes(grads, block, m)
            sent += N * (R - 1) * 4 * m + (N - 1) * run
            inter += (N - 1) * run
        else:
            run = run_bytes(grads, block, m)
            sent, inter = sent + (P - 1) * run, inter + (P - R) * run
    shard = padded // P
    per = chunk_length(shard, world, chunk_elems, params, param_block)
    for c in range(0, shard, per):
        n = min(per, shard - c)
        size = {"none": wire * n, "bf16": 2 * n}.get(params) or run_bytes("int8", param_block, n)
        if params != "none" and node_aware and R > 1:
            sent += (N - 1) * size + (R - 1) * N * size
            inter += (N - 1) * size
        else:
            sent, inter = sent + (P - 1) * size, inter + (P - R) * size
    return sent, inter


def split(flat, sizes):
    """A flat array (n' elements) as one array per parameter."""
    out, at = [], 0
    for n in sizes:
        out.append(flat[at:at + n].copy())
        at += n
    return out


def bf16_round(x):
    """fp32 -> bf16 -> fp32, round to nearest even (NaN kept)."""
    u = np.asarray(x, F32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(F32)
    return np.where(np.isnan(x), x, out).astype(F32)


def param_codec(codec, block, values):
    """What every rank's buffer holds after a compressed allgather of fp32
    master values (one chunk)."""
    if codec == "bf16":
        return bf16_round(values)
    return encode("int8", block, values)[1]


def shard_index(world, bucket_list, rank):
    """The flat positions of rank ``rank``'s shard, in shard order: its
    piece of every bucket, in bucket order."""
    return np.concatenate([np.arange(s + rank * (n // world), s + (rank + 1) * (n // world))
                           for s, n in bucket_list])


def as_kind(kind, values):
    """A parameter buffer of ``kind`` ("fp32", "bf16", "fp16") after fp32
    values are written into it: fp32 as they are; a 16-bit parameter takes
    them rounded to its dtype, nearest even, a NaN kept quiet (bf16 held
    as its uint16 bits, as the tests hand bf16 tensors over)."""
    x = np.asarray(values, F32)
    if kind == "fp32":
        return x.copy()
    if kind == "fp16":
        return x.astype(np.float64).astype(np.float16)
    assert kind == "bf16", kind
    u = x.view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((u >> 16) | 0x40).astype(np.uint16), bits)


def chunk_length(shard, world, chunk_elems, codec, block):
    """Elements per allgather chunk: allgather_bucket_size / P, at most the
    shard; the int8 codec's a multiple of its block, at least one."""
    per = max(1, chunk_elems // world)
    if codec == "int8":
        per = max(block, per // block * block)
    return min(shard, per)


def gathered(flat_masters, world, bucket_list, chunk_elems, codec, block):
    """Every rank's buffers after the compressed allgather: each owner's
    shard (its piece of every bucket, in bucket order) is encoded chunk by
    chunk (allgather_bucket_size / P elements each, int8's rounded down to
    whole blocks) and decoded in place."""
    out = np.array(flat_masters, F32)
    for r in range(world):
        index = shard_index(world, bucket_list, r)
        shard = out[index]
        per = chunk_length(len(shard), world, chunk_elems, codec, block)
        for c in range(0, len(shard), per):
            shard[c:c + per] = param_codec(codec, block, shard[c:c + per])
        out[index] = shard
    return out
