"""FSDP2's configurations (docs/guides/planner.md "FSDP2"): bytes, calls,
memory and step time of PyTorch's FSDP2 with dsopt's optimizer on the
shards (path "fsdp2"), its collectives FSDP2's own or dsopt.torch.fsdp's
codes, and of HSDP by dsopt (path "hsdp": FSDP2 inside each node of R
ranks, dsopt's exchange across the N nodes' replicas on each rank's
shards).

Per FSDP module (`fsdp_layout.py`), m its padded shard over the shard group
of S ranks (S = P for FSDP2, R for HSDP), as docs/guides/fsdp2-compression.md
"Bytes" counts them (a ring's bytes): a reduce-scatter per backward,
(S-1) G(m), and an all-gather per forward and another per backward when
the module reshards after forward, (S-1) A(m); G, A the codecs' bytes
(`codecs.py`; uncompressed: the parameters' own width). dsopt's optimizer
adds its allreduce of the status and norm over the shard group (16 bytes;
a trust-ratio rule 16 more per tensor; under HSDP 8 more, the group's
agreement that every rank could take its gradients); HSDP adds dsopt's exchange across
the replicas (`bytes.py`'s of the algorithm over N ranks on the rank's
local shards), all of it across nodes."""

import sys
from dataclasses import replace

from . import codecs, paths
from .bytes import StepBytes, _step_pairs, allreduce
from .collectives import Call, call_time, comm_time, step_calls
from .configs import Config
from .fsdp_layout import groups, local_sizes, modules_of
from .memory import memory as dsopt_memory
from .model import Model
from .network import Topology, flat_topology
from .timing import StepTime, _work
from .zero_memory import Memory


def _widths(config, model) -> tuple:
    """(parameter, gradient) bytes per element in FSDP2: the codes take
    fp32 parameters (dsopt.torch.fsdp refuses others), else the model's."""
    if (config.gradients, config.parameters) != ("none", "none"):
        return 4, 4
    w = 2 if model.half else 4
    return w, w


def module_bytes(config, model, ranks: int, settings) -> list:
    """(reduce-scatter bytes, all-gather bytes) per module and step."""
    pw, gw = _widths(config, model)
    out = []
    for mod in modules_of(model):
        m = mod.shard_numel(ranks)
        g = gw * m if config.gradients == "none" else codecs.run_bytes(
            config.gradients, settings.gradient_block_size, m)
        a = codecs.parameter_chunk_bytes(config.parameters, settings.parameter_block_size, m, pw)
        out.append(((ranks - 1) * g, (ranks - 1) * a * (2 if mod.reshard else 1)))
    return out


def collective_bytes(config, model, ranks: int, settings) -> int:
    """Bytes a rank sends per step in FSDP2's reduce-scatters and
    all-gathers over `ranks`: what ``Compression.bytes_sent`` counts."""
    return sum(r + a for r, a in module_bytes(config, model, ranks, settings))


def status_bytes(config, model, ranks: int, replicas: int = 1) -> int:
    """dsopt's allreduces over the shard group: the status and the norm,
    a trust-ratio rule's two partial sums per tensor, and with replicas
    (HSDP) first an 8-byte agreement that every rank of the group could
    take its gradients (src/optim/shard_group.cpp)."""
    if ranks == 1:
        return 0
    agree = allreduce(ranks, 8) if replicas > 1 else 0
    return agree + allreduce(ranks, 16) + (allreduce(ranks, 16 * model.tensors) if config.info.trust_ratio else 0)


def local_model(config, model, ranks: int, rank: int = 0) -> Model:
    """The shards rank `rank` holds, as a model of their own (rank 0 holds
    the most): in fp32 where the codes run (they take fp32 parameters),
    else in the model's dtype (16-bit ones get dsopt's fp32 masters)."""
    sizes = local_sizes(model, ranks, rank)
    compressed = (config.gradients, config.parameters) != ("none", "none")
    return Model(tuple(sizes), "fp32" if compressed else model.dtype)


def _replica_config(config):
    return Config(config.algorithm)


def step_pairs(config, model, topo: Topology, settings) -> tuple:
    """(StepBytes sent, StepBytes across nodes), as bytes._step_pairs."""
    S, N = groups(config, topo)
    own = collective_bytes(config, model, S, settings) + status_bytes(config, model, S, N)
    if config.path == "fsdp2":
        cross = 0
        if topo.nodes > 1:
            cross = sum((S - topo.ranks_per_node) * (r + a) // (S - 1)
                        for r, a in module_bytes(config, model, S, settings))
        return StepBytes(own), StepBytes(cross)
    rep, _ = _step_pairs(_replica_config(config), local_model(config, model, S), flat_topology(N), settings)
    kinds = ("steady", "warmup", "compressed", "local")
    sent = StepBytes(*(None if getattr(rep, k) is None else own + getattr(rep, k) for k in kinds))
    return sent, rep


def calls(config, model, topo: Topology, settings, kind="steady") -> list:
    """The step's calls: FSDP2's per module (stage "fsdp", at level "world"
    for FSDP2, "node" for HSDP), dsopt's status allreduce, and HSDP's
    exchange across the replicas (level "rail")."""
    S, N = groups(config, topo)
    level = "node" if config.path == "hsdp" and topo.nodes > 1 else "world"
    out = []
    if S > 1:
        for r, a in module_bytes(config, model, S, settings):
            op = "reduce_scatter" if config.gradients == "none" else "alltoall"
            out.append(Call(op, S * r // (S - 1), "fsdp", level=level))
            out.append(Call("allgather", S * a // (S - 1), "fsdp", level=level))
        if N > 1:
            out.append(Call("allreduce", 8, "control", level=level))
        out.append(Call("allreduce", 16, "control", level=level))
        if config.info.trust_ratio:
            out.append(Call("allreduce", 16 * model.tensors, "control", level=level))
    if config.path == "hsdp" and N > 1:
        rep = step_calls(_replica_config(config), local_model(config, model, S), N, settings, kind)
        out += [replace(c, level="rail") for c in rep]
    return out


def memory(config, model, topo: Topology, settings, overlapping_comm=True) -> Memory:
    """Rank 0's memory (it holds the most rows): dsopt's optimizer on its
    shards (`memory.memory` of the algorithm on those tensors: across N
    replicas for HSDP, alone for FSDP2), the codes' residuals (per module
    S runs of int8 codes of m: S ceil(m/b) (4+b) bytes, about 1.06 bytes
    per parameter of the module) and the largest call's codes in flight;
    `caller`: the sharded parameters and gradients, with the largest
    module's unsharded parameters and gradients during its forward and
    backward."""
    S, N = groups(config, topo)
    local = local_model(config, model, S)
    if N > 1:
        own = dsopt_memory(_replica_config(config), local, N, settings, overlapping_comm=overlapping_comm)
    else:
        own = dsopt_memory(_replica_config(config), local, 1, settings)
    residual = flight = 0
    compressed = (config.gradients, config.parameters) != ("none", "none")
    if S > 1 and compressed:
        b = settings.gradient_block_size
        for mod in modules_of(model):
            m = mod.shard_numel(S)
            if config.gradients != "none":
                if settings.error_feedback:
                    residual += codecs.run_bytes("int8", b, m) * S
                flight = max(flight, 2 * S * codecs.run_bytes(config.gradients, b, m))
            if config.parameters != "none":
                flight = max(flight, S * codecs.parameter_chunk_bytes(
                    config.parameters, settings.parameter_block_size, m, 4))
    pw, gw = _widths(config, model)
    shards = (pw + gw) * local.numel
    largest = max(mod.shard_numel(S) * S for mod in modules_of(model))
    caller = shards + (pw + gw) * largest
    return Memory(own.total + residual + flight, own.state + residual, own.warmup + residual + flight, caller)


def step_time(config, model, cluster, settings, profile, compute, kind="steady"):
    """FSDP2 prefetches each module's all-gather behind the compute before
    it and reduce-scatters behind the backward after it: its collectives
    show only where they outlast the compute, and at least the largest
    module's gather and reduction (the first forward's gather and the
    last backward's reduction wait for nothing to hide behind). dsopt's
    status allreduce and HSDP's exchange across the replicas follow the
    backward."""
    S, N = groups(config, cluster.topo)
    cs = calls(config, model, cluster.topo, settings, kind)
    ours = [c for c in cs if c.stage == "fsdp"]
    fsdp_comm = comm_time(ours, cluster)
    per_module = [call_time(ours[i], cluster) + call_time(ours[i + 1], cluster)
                  for i in range(0, len(ours), 2)]
    exposed = max(fsdp_comm - compute, max(per_module, default=0.0)) if ours else 0.0
    rest = comm_time([c for c in cs if c.stage != "fsdp"], cluster)
    local = local_model(config, model, S)
    update, compression = _work(_replica_config(config), local, N, settings, profile, kind)
    if (config.gradients, config.parameters) != ("none", "none") and S > 1:
        compression += profile.cost(f"codec:{config.gradients}/{config.parameters}") * model.numel
    o = cluster.cpu_oversubscription
    return StepTime(compute, update * o, compression * o, fsdp_comm + rest, exposed + rest)


paths.register(("fsdp2", "hsdp"), sys.modules[__name__])
