"""The 1-bit compressed allreduce's memory per rank (1-bit Adam, 1-bit
LAMB, 0/1 Adam), flat (src/comm/compressed_allreduce.cpp) or node-aware
(src/comm/node_aware_allreduce.cpp, with the fp32 or the 1-bit node
step): its error-feedback buffers, the part of them the state blob saves,
and its working buffers, as the library allocates them (`memory.py` adds
them to the optimizers')."""

from dataclasses import dataclass

from .bytes import car_slices
from .layout import car_largest_piece, car_message_bytes, car_padded
from .network import Topology


def car_buffers(sizes, world: int, overlapping: bool) -> int:
    """The compressed allreduce's working buffers: the signs sent and
    received (P messages each) and the server's, plus, cut into pieces, the
    largest piece's discard buffer."""
    if world == 1:
        return 0
    msg = car_message_bytes(sizes, world)
    pieces, largest = car_largest_piece(sizes, world, overlapping)
    return (2 * world + 1) * msg + (largest * world if pieces > 1 else 0)


def car_errors(sizes, world: int) -> int:
    """Worker errors (4 n' bytes) and server errors (4 n'/P), in the state
    blob where P > 1."""
    if world == 1:
        return 0
    padded = sum(car_padded(n, world) for n in sizes)
    return 4 * padded + 4 * padded // world


@dataclass(frozen=True)
class CarMemory:
    errors: int   # the error buffers held (dsopt_memory_usage)
    state: int    # the part the state blob saves (dsopt_state_memory_usage)
    buffers: int  # the working buffers


def car_memory(sizes, world: int, overlapping: bool, topo: Topology = None) -> CarMemory:
    """The allreduce of tensors `sizes` over `world` ranks, flat, or
    node-aware where `topo` says so (N nodes of R ranks, P = N R).
    `overlapping`: the communicator (and its node and rail ones) overlaps
    transfers, so the flat allreduce is cut into pieces."""
    if world == 1:
        return CarMemory(0, 0, 0)
    if topo is None or not topo.node_aware or topo.ranks_per_node == 1:
        # R = 1: the node-aware form is the flat one over the rail (every rank).
        errors = car_errors(sizes, world)
        return CarMemory(errors, errors, car_buffers(sizes, world, overlapping))
    if topo.world != world:
        raise ValueError(f"a topology of {topo.world} ranks for {world} ranks")
    if topo.onebit_node:
        return _onebit_node(sizes, topo.nodes, topo.ranks_per_node, overlapping)
    return _node_aware(sizes, topo.nodes, topo.ranks_per_node, overlapping)


def _node_aware(sizes, N: int, R: int, overlapping: bool) -> CarMemory:
    """NodeAwareAllreduce of R > 1 ranks a node: the flat allreduce over the
    rail (N ranks) on the slices m_t = ceil(n_t / R), whose errors are
    4 n''_t + 4 n''_t / N (n''_t = padded_length(m_t, N); made on one node
    too, where the blob saves none of them); the R blocks of sum_t m_t
    floats (the reduce-scatter's input, then the decoded slices) and this
    rank's block; with N > 1 the R rail results' signs (R N messages); and
    the zeros padding the last slices, max_t (R m_t - n_t) floats. With
    N > 1 the R blocks hold only the packed tensors: a tensor with n_t a
    multiple of R and m_t >= 65,536 (NodeAwareAllreduce::in_place) is
    reduce-scattered from the parameters' buffer itself."""
    slices = car_slices(sizes, R)
    if N == 1:
        # The rail allreduce of one rank keeps its errors (padded to 8) and sends nothing.
        errors, state = 8 * sum(car_padded(m, 1) for m in slices), 0
    else:
        errors = state = car_errors(slices, N)
    packed = [(m, n) for m, n in zip(slices, sizes) if not in_place(n, R)]
    block = 4 * sum(slices)
    blocks = R * (block if N == 1 else 4 * sum(m for m, _ in packed))
    buffers = car_buffers(slices, N, overlapping) + block + blocks
    if N > 1:
        buffers += R * N * car_message_bytes(slices, N)
    pad = max((R * m - n for m, n in packed), default=0)
    return CarMemory(errors, state, buffers + 4 * pad)


def _onebit_node(sizes, N: int, R: int, overlapping: bool) -> CarMemory:
    """NodeAwareAllreduce with the 1-bit node step (N > 1, R > 1): the
    node allreduce, a flat 1-bit allreduce over the node (R ranks) on the
    tensors themselves, of which the step runs the first half: its worker
    errors 4 n'_t (n'_t = padded_length(n_t, R)), its server errors
    4 n'_t / R (this rank's slices, zero between calls) and its sign
    buffers; the rail allreduce over the slices m_t = n'_t / R, errors and
    buffers; the R blocks that receive the decoded slices of the tensors
    with padding (R m_t > n_t; the others take them straight into the
    parameters' buffer) and the R rail results' signs (R N messages). No
    block of this rank's own and no padding zeros. The state blob saves the
    rail's errors and the node worker errors (<opt>.node_error)."""
    slices = car_slices(sizes, R, True)
    node_worker = 4 * sum(car_padded(n, R) for n in sizes)
    rail = car_errors(slices, N)
    errors = car_errors(sizes, R) + rail
    padded = sum(m for m, n in zip(slices, sizes) if R * m != n)
    buffers = (car_buffers(sizes, R, overlapping) + car_buffers(slices, N, overlapping)
               + R * 4 * padded + R * N * car_message_bytes(slices, N))
    return CarMemory(errors, rail + node_worker, buffers)


IN_PLACE_SLICE = 1 << 16


def in_place(n: int, R: int) -> bool:
    """NodeAwareAllreduce::in_place: a tensor reduce-scattered in place."""
    return n % R == 0 and n // R >= IN_PLACE_SLICE
