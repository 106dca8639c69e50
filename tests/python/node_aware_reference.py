"""numpy reference of the node-aware 1-bit compressed allreduce, written from
docs/design/node-aware-allreduce.md (not from the C++), with the flat form of
onebit_reference.CarReference across nodes.

Ranks are declared as N nodes of R ranks: rank = node * R + local. One call on
a tensor of n values:

1. inside each node, uncompressed: every rank's x padded with zeros to R * m
   (m = ceil(n / R)); slice j = elements [j m, (j + 1) m). Local rank j gets
   the sum of slice j over the node's ranks in dsopt's fixed order (comm.hpp:
   ((x[j+1] + x[j+2]) + ...) + x[j], local indices mod R, one fp32 rounding
   per addition), times fl(1 / R): y_j, the node mean of slice j;
2. across nodes, compressed: the ranks of local index j (one per node, in node
   order) run the flat error-compensated compressed allreduce of a tensor of
   m values with P = N: their worker errors have padded_length(m, N) values,
   their server errors padded_length(m, N) / N;
3. inside each node: the decompressed slices gathered, the first n values
   being the result on every rank.

With N = 1 step 2 is skipped (no compression inside one node; the errors
stay zero). With R = 1 steps 1 and 3 are copies and step 2 is the flat form.

The 1-bit node step (topology.node_reduce "1bit", N > 1 and R > 1) replaces
step 1 by the first half of the flat compressed allreduce over the node's R
ranks (CarReference.reduce_scatter): every rank compresses its whole tensor
with its node worker error (padded_length(n, R) values) and local rank j
keeps y_j, the average of the decoded signs of chunk j; the slices are these
chunks, m = padded_length(n, R) / R.
"""

import numpy as np

from onebit_reference import F32, CarReference, padded_length


def slice_length(n: int, ranks_per_node: int, onebit_node: bool = False) -> int:
    if onebit_node and ranks_per_node > 1:
        return padded_length(n, ranks_per_node) // ranks_per_node
    return -(-n // ranks_per_node)


def onebit_node_step(asked: bool, nodes: int, ranks_per_node: int) -> bool:
    return asked and nodes > 1 and ranks_per_node > 1


def node_mean_slices(xs, n: int, ranks_per_node: int):
    """xs: the inputs of one node's ranks in local order. Returns y[j] for
    j < R: the fixed-order sum of slice j over the node, times fl(1/R)."""
    R = ranks_per_node
    m = slice_length(n, R)
    padded = []
    for x in xs:
        p = np.zeros(R * m, np.float32)
        p[:n] = np.asarray(x, np.float32).ravel()
        padded.append(p)
    inv = F32(1.0) / F32(R)
    out = []
    for j in range(R):
        part = lambda i: padded[i % R][j * m:(j + 1) * m]  # noqa: E731
        acc = part(j + 1).copy()
        for k in range(2, R + 1):
            acc = (acc + part(j + k)).astype(np.float32)
        out.append((acc * inv).astype(np.float32))
    return out


class NodeAwareReference:
    """Error state of one tensor on every rank; ``run`` is one call."""

    def __init__(self, n: int, nodes: int, ranks_per_node: int, onebit_node: bool = False):
        self.n, self.nodes, self.R = n, nodes, ranks_per_node
        self.onebit = onebit_node_step(onebit_node, nodes, ranks_per_node)
        self.m = slice_length(n, ranks_per_node, self.onebit)
        # one flat allreduce per rail (local index), over the N nodes
        self.rails = [CarReference(self.m, nodes) for _ in range(ranks_per_node)]
        # the 1-bit node step: one flat allreduce's first half per node
        self.node_cars = [CarReference(n, ranks_per_node) for _ in range(nodes)] if self.onebit else []

    def node_error(self, rank):
        return self.node_cars[rank // self.R].ew[rank % self.R]

    def worker_error(self, rank):
        return self.rails[rank % self.R].ew[rank // self.R]

    def server_error(self, rank):
        return self.rails[rank % self.R].es[rank // self.R]

    def run(self, xs):
        """xs[rank]: this tensor's input on every rank. Returns the output
        (the same on every rank) and the rails' wires."""
        N, R, n, m = self.nodes, self.R, self.n, self.m
        if self.onebit:
            y = [self.node_cars[k].reduce_scatter(xs[k * R:(k + 1) * R])[0] for k in range(N)]
        else:
            y = [node_mean_slices(xs[k * R:(k + 1) * R], n, R) for k in range(N)]  # y[node][j]
        slices, wires = [], []
        for j in range(R):
            if N == 1:  # one node: no compression, the errors stay zero
                slices.append(y[0][j])
                continue
            out, wire = self.rails[j].run([y[k][j] for k in range(N)])
            slices.append(out)
            wires.append(wire)
        return np.concatenate(slices)[:n].astype(np.float32), wires


def rail_bytes(sizes, nodes: int, ranks_per_node: int, onebit_node: bool = False) -> int:
    """Bytes per rank and call that cross node boundaries (the rail
    communicator's): per tensor one all-to-all block and one gathered server
    chunk of padded_length(m, N) / N bits to each of the N - 1 other nodes,
    plus two fp32 scales."""
    N = nodes
    onebit = onebit_node_step(onebit_node, nodes, ranks_per_node)
    chunk = sum(padded_length(slice_length(n, ranks_per_node, onebit), N) // N // 8 for n in sizes)
    return (N - 1) * (2 * chunk + 8 * len(sizes))


def node_bytes(sizes, nodes: int, ranks_per_node: int, onebit_node: bool = False) -> int:
    """Bytes per rank and call inside the node, to each of the R - 1 others:
    the fp32 reduce-scatter of one block of sum(m) values (the 1-bit node
    step: one chunk of signs, m / 8 bytes, and one fp32 scale per tensor),
    and the allgather of the rail's result as it arrived (the N ranks'
    server signs, padded_length(m, N) / 8 bytes per tensor, and N fp32
    scales per tensor); with one node, the allgather of the fp32 block."""
    N, R = nodes, ranks_per_node
    onebit = onebit_node_step(onebit_node, nodes, ranks_per_node)
    slices = [slice_length(n, R, onebit) for n in sizes]
    block = 4 * sum(slices)
    if N == 1:
        return 2 * (R - 1) * block
    reduced = sum(m // 8 for m in slices) + 4 * len(sizes) if onebit else block
    codes = sum(padded_length(m, N) // 8 for m in slices)
    return (R - 1) * (reduced + codes + 4 * N * len(sizes))


def flat_bytes(sizes, world: int, peers: int) -> int:
    """The flat form's bytes per rank and call to `peers` other ranks (P - 1:
    all it sends; P - R: those to other nodes, every block sent straight to
    its destination)."""
    chunk = sum(padded_length(n, world) // world // 8 for n in sizes)
    return peers * (2 * chunk + 8 * len(sizes))
