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

from .collectives import comm_time, step_calls
from .layout import car_largest_piece, car_padded, zero_layout


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


def _work(config, model, world, settings, profile, kind):
    """(update, compression) seconds of one step of `kind`."""
    n, c = model.numel, profile.cost
    if config.kind == "adamw":
        return c("adamw") * n, 0.0
    if config.zero:
        lay = zero_layout(n, world, settings.reduce_bucket_size, settings.allgather_bucket_size)
        update = c("zero_update") * lay.shard + _packing(model, world, profile)
        comp = c(f"codec:{config.gradients}/{config.parameters}") * n if config.kind == "czero" and world > 1 else 0.0
        return update, comp
    coded = world > 1
    if config.kind == "onebit_adam":
        if kind == "warmup":
            return c("adamw") * n, 0.0
        return c("onebit_adam_update") * n, c("onebit_adam_compress") * n if coded else 0.0
    if config.kind == "onebit_lamb":
        if kind == "warmup":
            return c("onebit_lamb_warmup") * n, 0.0
        return c("onebit_lamb_update") * n, c("onebit_lamb_compress") * n if coded else 0.0
    if config.kind == "zoadam":
        if kind == "warmup":
            return c("zoadam_full") * n, 0.0
        return c("zoadam_local") * n, (c("zoadam_compress") * n if coded and kind == "compressed" else 0.0)
    raise ValueError(f"unknown configuration kind {config.kind!r}")


def pipelined(work: float, wire: float, pieces: int) -> float:
    """Seconds of `work` on the CPU and `wire` seconds of transfers cut into
    `pieces` equal pieces, each piece's transfer after its work: the
    two-stage pipeline's max(work, wire) + min(work, wire) / pieces (the
    first piece's work and the last one's transfer cannot overlap
    anything); one piece runs them one after the other."""
    return max(work, wire) + min(work, wire) / pieces if pieces > 1 else work + wire


def _car_pieces(config, model, world):
    """How many pieces MPI's compressed allreduce runs in (its arithmetic
    overlaps the transfers only with more than one)."""
    sizes = [car_padded(model.numel, world)] if config.kind == "onebit_lamb" else list(model.sizes)
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
        t = max(t, ready) + c.share * grad_work + getattr(cluster, c.op)(c.nbytes)
        done = t
    return max(0.0, done - backward) + other, grad_work


def step_time(config, model, cluster, settings, profile, compute: float, backward_fraction=2 / 3,
              kind="steady", overlapping_comm=True) -> StepTime:
    """`overlapping_comm`: the communicator overlaps transfers with dsopt's
    work (MPI on host buffers), so the 1-bit compressed allreduce's
    arithmetic runs while its pieces are on the wire."""
    world = cluster.ranks
    calls = step_calls(config, model, world, settings, kind)
    comm = comm_time(calls, cluster)
    update, compression = (x * cluster.cpu_oversubscription
                           for x in _work(config, model, world, settings, profile, kind))
    pieces = _car_pieces(config, model, world) if config.onebit and overlapping_comm else 1
    if compression > 0 and pieces > 1:
        car = _grad_seconds(calls, cluster)
        hidden = car + compression - pipelined(compression, car, pieces)
        return StepTime(compute, update, compression, comm, comm - hidden)
    if config.overlap and world > 1:
        # The gradient codec's share of the coding runs with the reductions.
        grad_work = compression * (0.5 if config.kind == "czero" and config.parameters != "none" else 1.0)
        exposed, hidden_work = _exposed(calls, cluster, backward_fraction * compute, grad_work)
        # The coding done behind backward is counted in `exposed` where it shows.
        return StepTime(compute, update, compression - hidden_work, comm, exposed)
    hidden = _packing_hidden(config, model, world, settings, profile, cluster, calls)
    return StepTime(compute, update, compression, comm, comm - hidden)
