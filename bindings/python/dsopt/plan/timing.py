"""Predicted step time of a configuration: compute (forward and backward,
given or measured), the update (the optimizer's own work per element, from
the profile), compression (the 1-bit path and the codecs, from the
profile), and the communication left exposed (the network model of the
calls `collectives.py` lists). The 1-bit compressed allreduce, where its
communicator overlaps transfers, runs its arithmetic and its transfers as
a pipeline over its pieces (`pipelined`). ZeRO's gradients passed at
once are packed bucket by bucket on the calling thread while the previous
bucket is reduced on the communication thread, so the packing of every
bucket but the first runs while gradients are on the wire (`_packing_hidden`).
With gradients handed over during backward the gradient reductions run
behind the backward part of the compute, bucket by bucket from the last;
the parameter allgather follows the update and is never hidden."""

from dataclasses import dataclass

from . import paths
from .algorithms import BASELINE, describe
from .collectives import call_time, comm_time, step_calls
from .bytes import car_sizes, car_slices
from .layout import car_largest_piece, zero_layout


@dataclass(frozen=True)
class StepTime:
    compute: float
    update: float
    compression: float
    comm: float          # all communication of the step
    exposed: float       # the part not hidden behind backward

    @property
    def total(self) -> float:
        return self.compute + self.update + self.compression + self.exposed


def _grad_seconds(calls, cluster):
    """The network time of the step's gradient reductions."""
    return comm_time([c for c in calls if c.stage == "grad"], cluster)


def _packing(model, world, profile):
    """ZeRO's packing and writing back of every element (none at one rank)."""
    return profile.cost("zero_pack") * model.numel if world > 1 else 0.0


# Bytes a moment rule's update reads and writes per element: the gradient,
# the parameter (read and written) and each moment (read and written); a
# trust-ratio rule (LAMB) writes its update u, reads it again, and reads
# the parameter once more for its norm.
def update_traffic(alg) -> int:
    return 12 + 8 * alg.moments + (12 if alg.trust_ratio else 0)


def update_cost(config, profile, zero: bool) -> float:
    """Seconds per element of a moment rule's update: the profile's own
    cost of the algorithm where it has one ("update:TYPE",
    "zero_update:TYPE", `calibrate.py`), else AdamW's ("adamw",
    "zero_update") scaled by the bytes each update moves (`update_traffic`)."""
    base = "zero_update" if zero else "adamw"
    if config.algorithm == BASELINE:
        return profile.cost(base)
    own = f"{'zero_update' if zero else 'update'}:{config.algorithm}"
    if own in profile.costs:
        return profile.cost(own)
    return profile.cost(base) * update_traffic(config.info) / update_traffic(describe(BASELINE))


def coded_share(config, topo) -> float:
    """The share of the compression work per element that a rank does in
    the node-aware form (docs/guides/multi-node.md "Times"): the 1-bit
    allreduce compresses a slice of 1/R of the elements (none at N = 1),
    and with the 1-bit node step (`topo.onebit_node`) also every element
    inside the node, costed as a whole 1-bit allreduce of the tensors
    (1 + 1/R); a gradient codec encodes and decodes a node-slice of 1/R
    (none at N = 1), the parameter codec all it did; a codec pair's cost
    counts half for each."""
    if topo is None or not topo.node_aware:
        return 1.0
    grad = 1.0 / topo.ranks_per_node if topo.nodes > 1 else 0.0
    if not config.zero:
        return grad + (1.0 if topo.onebit_node else 0.0)
    if config.gradients == "none":
        return 1.0
    if config.parameters == "none":
        return grad
    return (grad + 1.0) / 2


def _work(config, model, world, settings, profile, kind, topo=None):
    """(update, compression) seconds of one step of `kind`."""
    n, c = model.numel, profile.cost
    share = coded_share(config, topo)
    if config.zero:
        lay = zero_layout(n, world, settings.reduce_bucket_size, settings.allgather_bucket_size)
        update = update_cost(config, profile, True) * lay.shard + _packing(model, world, profile)
        comp = c(f"codec:{config.gradients}/{config.parameters}") * n if config.codecs and world > 1 else 0.0
        return update, comp * share
    if not config.onebit:
        return update_cost(config, profile, False) * n, 0.0
    coded = world > 1
    prefix = config.info.cost_prefix
    if config.info.schedule == "zero_one":
        if kind == "warmup":
            return c(f"{prefix}_full") * n, 0.0
        return c(f"{prefix}_local") * n, (c(f"{prefix}_compress") * n * share
                                          if coded and kind == "compressed" else 0.0)
    if kind == "warmup":
        # 1-bit LAMB's warmup is its own (LAMB's) step; 1-bit Adam's AdamW's.
        return (c(f"{prefix}_warmup") if config.info.trust_ratio else c("adamw")) * n, 0.0
    return c(f"{prefix}_update") * n, c(f"{prefix}_compress") * n * share if coded else 0.0


def pipelined(work: float, wire: float, pieces: int) -> float:
    """Seconds of `work` on the CPU and `wire` seconds of transfers cut into
    `pieces` equal pieces, each piece's transfer after its work: the
    two-stage pipeline's max(work, wire) + min(work, wire) / pieces (the
    first piece's work and the last one's transfer cannot overlap
    anything); one piece runs them one after the other."""
    return max(work, wire) + min(work, wire) / pieces if pieces > 1 else work + wire


def _car_pieces(config, model, world, topo=None):
    """How many pieces MPI's compressed allreduce runs in (its arithmetic
    overlaps the transfers only with more than one); node-aware: the rail
    allreduce's over the slices (with the 1-bit node step, the whole
    step's arithmetic is taken as one pipeline over the rail's pieces)."""
    sizes = car_sizes(config, model, world)
    if topo is not None and topo.node_aware:
        if topo.nodes == 1:
            return 1
        slices = car_slices(sizes, topo.ranks_per_node, topo.onebit_node)
        return car_largest_piece(slices, topo.nodes, True)[0]
    return car_largest_piece(sizes, world, True)[0]


def _packing_hidden(config, model, world, settings, profile, cluster, calls):
    """Seconds of ZeRO's packing that run while the previous bucket's
    gradients cross the wire (dsopt_step with the gradients at once): each
    bucket after the first is packed while the one before it is reduced,
    so the packing hides behind the transfers (not behind the codecs'
    arithmetic, which needs the same cores) up to their length."""
    if not config.zero or world < 2:
        return 0.0
    lay = zero_layout(model.numel, world, settings.reduce_bucket_size, settings.allgather_bucket_size)
    buckets = len(lay.buckets)
    pack = _packing(model, world, profile) * cluster.cpu_oversubscription
    wire = _grad_seconds(calls, cluster)
    return min(pack, wire) * (buckets - 1) / buckets


def _exposed(calls, cluster, backward, grad_work):
    """Communication not hidden behind `backward` seconds: gradient buckets
    become complete in reverse parameter order as backward runs and are
    reduced one after another (each after its share of `grad_work`, the
    encoding done on the reduction thread)."""
    grads = sorted((c for c in calls if c.stage == "grad"), key=lambda c: -c.bucket)
    other = comm_time([c for c in calls if c.stage != "grad"], cluster)
    done, ready, t = 0.0, 0.0, 0.0
    for c in grads:
        ready += c.share * backward
        t = max(t, ready) + c.share * grad_work + call_time(c, cluster)
        done = t
    return max(0.0, done - backward) + other, grad_work


def step_time(config, model, cluster, settings, profile, compute: float, backward_fraction=2 / 3,
              kind="steady", overlapping_comm=True) -> StepTime:
    """`overlapping_comm`: the communicator overlaps transfers with dsopt's
    work (MPI on host buffers), so the 1-bit compressed allreduce's
    arithmetic runs while its pieces are on the wire."""
    if config.fsdp:
        return paths.model_of(config).step_time(config, model, cluster, settings, profile, compute, kind)
    world = cluster.ranks
    topo = cluster.topo
    calls = step_calls(config, model, world, settings, kind, topo)
    comm = comm_time(calls, cluster)
    update, compression = (x * cluster.cpu_oversubscription
                           for x in _work(config, model, world, settings, profile, kind, topo))
    pieces = _car_pieces(config, model, world, topo) if config.onebit and overlapping_comm else 1
    if compression > 0 and pieces > 1:
        car = _grad_seconds(calls, cluster)
        hidden = car + compression - pipelined(compression, car, pieces)
        return StepTime(compute, update, compression, comm, comm - hidden)
    if config.overlap and world > 1:
        # The gradient codec's share of the coding runs with the reductions.
        grad_work = compression * (0.5 if config.codecs and config.parameters != "none" else 1.0)
        exposed, hidden_work = _exposed(calls, cluster, backward_fraction * compute, grad_work)
        # The coding done behind backward is counted in `exposed` where it shows.
        return StepTime(compute, update, compression - hidden_work, comm, exposed)
    hidden = _packing_hidden(config, model, world, settings, profile, cluster, calls)
    return StepTime(compute, update, compression, comm, comm - hidden)
