"""An alpha-beta model of the collectives dsopt issues.

A collective costs its sequential rounds times the latency alpha plus, for
each link it uses, the bytes that link carries over its bandwidth; the
busiest link sets the time. Two topologies:

* ``nodes``: P ranks in nodes of R ranks. Inside a node each rank has its
  own path at the intra-node bandwidth; between nodes each node has one
  network interface carrying its ranks' off-node traffic at the inter-node
  bandwidth (each direction). Ring collectives run their ring node by node,
  so each node's interface carries one ring hop.
* ``shared``: one link carries every rank's traffic (a switch-less shared
  medium; bench/netem.sh's emulated loopback, which all ranks share).

Rings (allreduce, reduce-scatter, allgather) and the all-to-all are those
dsopt's own host path runs (docs/guides/communicators.md). The node-aware
form of the compressed collectives (``hierarchy``; docs/guides/multi-node.md)
runs some calls on a sub-communicator: ``node`` (the R ranks of a node, on
the intra-node links) and ``rail`` (the N ranks of one local index, one per
node; the R rails of a node run at once and share its interface, so a rail
call sees 1/R of the inter-node bandwidth). Small control allreduces
(16 bytes) cost 2 ceil(log2 P) rounds, as MPI's and NCCL's latency-bound
algorithms take. The 1-bit family's node-aware allreduce reduces inside
the node in fp32 or, with ``node_reduce`` "1bit" (config
"topology.node_reduce"), with the first half of a 1-bit allreduce over the
node (``Topology.onebit_node``)."""

from dataclasses import dataclass, replace
from math import ceil, log2

from .units import parse_bandwidth, parse_count, parse_time


@dataclass(frozen=True)
class Cluster:
    ranks: int
    ranks_per_node: int
    intra_bandwidth: float      # bytes/s per rank inside a node
    inter_bandwidth: float      # bytes/s per node between nodes (each direction)
    intra_latency: float = 2e-6
    inter_latency: float = 10e-6
    topology: str = "nodes"     # or "shared"
    cpu_oversubscription: float = 1.0  # CPU threads of the ranks per core of their machine (>= 1 slows their work)
    hierarchy: str = "auto"     # the compressed collectives' form: "auto", "flat", "node_aware" (config "topology")
    node_reduce: str = "fp32"   # the 1-bit family's node step: "fp32" or "1bit" (config "topology.node_reduce")

    def __post_init__(self):
        for name in ("ranks", "ranks_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name.replace('_', ' ')} must be a positive integer, got {v!r}")
        if self.ranks % self.ranks_per_node and self.ranks > self.ranks_per_node:
            raise ValueError(f"ranks ({self.ranks}) must be a multiple of ranks per node ({self.ranks_per_node})")
        for name in ("intra_bandwidth", "inter_bandwidth"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"{name.replace('_', ' ')} must be positive, got {v!r}")
        for name in ("intra_latency", "inter_latency"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name.replace('_', ' ')} must be >= 0")
        if not self.cpu_oversubscription > 0:
            raise ValueError(f"cpu oversubscription must be positive, got {self.cpu_oversubscription!r}")
        if self.topology not in ("nodes", "shared"):
            raise ValueError(f'topology must be "nodes" or "shared", got {self.topology!r}')
        if self.hierarchy not in HIERARCHIES:
            raise ValueError(f"hierarchy must be one of {', '.join(HIERARCHIES)}, got {self.hierarchy!r}")
        if self.node_reduce not in NODE_REDUCES:
            raise ValueError(f"node reduce must be one of {', '.join(NODE_REDUCES)}, got {self.node_reduce!r}")

    @classmethod
    def parse(cls, ranks, ranks_per_node=None, intra="600GB/s", inter="25gbit", intra_latency="2us",
              inter_latency="10us", topology="nodes", cpu_oversubscription=1.0, hierarchy="auto",
              node_reduce="fp32") -> "Cluster":
        p = parse_count(ranks, "ranks")
        r = p if ranks_per_node is None else min(p, parse_count(ranks_per_node, "ranks per node"))
        return cls(p, r, parse_bandwidth(intra, "intra-node bandwidth"),
                   parse_bandwidth(inter, "inter-node bandwidth"),
                   parse_time(intra_latency, "intra-node latency"),
                   parse_time(inter_latency, "inter-node latency"), topology, float(cpu_oversubscription),
                   hierarchy, node_reduce)

    @classmethod
    def from_measurement(cls, network: dict, ranks=None) -> "Cluster":
        """The cluster a measured communicator (calibrate.measure_network)
        stands for: its ranks in one node whose ring allreduce moves
        `bandwidth` bytes per second per rank after `latency` per round."""
        p = int(ranks or network["ranks"])
        return cls(p, p, float(network["bandwidth"]), float(network["bandwidth"]),
                   float(network["latency"]), float(network["latency"]),
                   cpu_oversubscription=float(network.get("cpu_oversubscription", 1.0)))

    @property
    def nodes(self) -> int:
        return max(1, self.ranks // self.ranks_per_node)

    @property
    def node_aware(self) -> bool:
        """Whether the compressed collectives run node-aware (the library's
        rule: "auto" is node-aware where N > 1 and R > 1; "node_aware"
        always, which at R = 1 is the flat form and at N = 1 averages
        inside the node only)."""
        return resolve_hierarchy(self.hierarchy, self.nodes, self.ranks_per_node)

    @property
    def onebit_node(self) -> bool:
        """Whether the 1-bit family's node-aware allreduce runs the 1-bit
        node step (the library's rule: node_reduce "1bit", node-aware, and
        N > 1 and R > 1; otherwise the fp32 node step)."""
        return resolve_node_reduce(self.node_reduce, self.node_aware, self.nodes, self.ranks_per_node)

    @property
    def topo(self) -> "Topology":
        """The topology the byte formulas take."""
        return Topology(self.nodes, self.ranks_per_node, self.node_aware, self.onebit_node)

    def level(self, name: str) -> "Cluster":
        """The cluster a call on the `name` communicator sees: "world"
        (this one), "node" (one node of R ranks) or "rail" (N ranks, one per
        node, each node's interface shared by its R rails)."""
        if name == "world":
            return self
        N, R = self.nodes, self.ranks_per_node
        if name == "node":
            return replace(self, ranks=R, ranks_per_node=R, inter_bandwidth=self.inter_bandwidth / N)
        if name == "rail":
            return replace(self, ranks=N, ranks_per_node=1, inter_bandwidth=self.inter_bandwidth / R)
        raise ValueError(f"unknown communicator level {name!r}")

    def call(self, op: str, nbytes: float, level: str = "world") -> float:
        return getattr(self.level(level), op)(nbytes)

    @property
    def alpha(self) -> float:
        return self.inter_latency if self.nodes > 1 or self.topology == "shared" else self.intra_latency

    # ---- bytes through the busiest link -----------------------------------

    def _time(self, per_rank: float, per_node_out: float, rounds: int) -> float:
        """`per_rank`: bytes each rank sends; `per_node_out`: bytes each
        node's interface sends off the node."""
        P = self.ranks
        if P == 1:
            return 0.0
        if self.topology == "shared":
            wire = P * per_rank / self.inter_bandwidth
        else:
            wire = per_rank / self.intra_bandwidth
            if self.nodes > 1:
                wire = max(wire, per_node_out / self.inter_bandwidth)
        return rounds * self.alpha + wire

    def ring(self, per_rank_bytes: float, rounds: int) -> float:
        """A ring collective in which each rank sends `per_rank_bytes`: each
        node's interface carries one hop of the ring, as much as one rank."""
        return self._time(per_rank_bytes, per_rank_bytes, rounds)

    def allreduce(self, nbytes: float) -> float:
        P = self.ranks
        if nbytes <= 64:
            return 2 * ceil(log2(P)) * self.alpha if P > 1 else 0.0
        return self.ring(2 * (P - 1) * nbytes / P, 2 * (P - 1))

    def reduce_scatter(self, nbytes: float) -> float:
        """`nbytes`: the whole buffer (every rank's block)."""
        P = self.ranks
        return self.ring((P - 1) * nbytes / P, P - 1)

    def allgather(self, nbytes: float) -> float:
        """`nbytes`: the whole result (every rank's block)."""
        return self.reduce_scatter(nbytes)

    def alltoall(self, nbytes: float) -> float:
        """`nbytes`: what one rank sends in all (a block to every rank, its
        own included): off-node blocks leave through the node's interface."""
        P, R = self.ranks, self.ranks_per_node
        block = nbytes / P
        return self._time((P - 1) * block, R * (P - R) * block, P - 1)

    def describe(self) -> str:
        form = "; compressed collectives node-aware" if self.node_aware else ""
        if self.onebit_node:
            form += " (the 1-bit family's node step in 1-bit codes)"
        if self.topology == "shared":
            return (f"{self.ranks} ranks on one shared link of {self.inter_bandwidth * 8 / 1e9:g} Gbit/s, "
                    f"latency {self.inter_latency * 1e6:g} us{form}")
        return (f"{self.ranks} ranks, {self.ranks_per_node} per node ({self.nodes} nodes); "
                f"inside a node {self.intra_bandwidth * 8 / 1e9:g} Gbit/s per rank, "
                f"{self.intra_latency * 1e6:g} us; between nodes {self.inter_bandwidth * 8 / 1e9:g} Gbit/s "
                f"per node, {self.inter_latency * 1e6:g} us{form}")


HIERARCHIES = ("auto", "flat", "node_aware")
NODE_REDUCES = ("fp32", "1bit")


def resolve_hierarchy(hierarchy: str, nodes: int, ranks_per_node: int) -> bool:
    """Whether `hierarchy` ("auto", "flat", "node_aware") runs the
    compressed collectives node-aware on N nodes of R ranks."""
    if hierarchy == "flat":
        return False
    if hierarchy == "node_aware":
        return True
    return nodes > 1 and ranks_per_node > 1


def resolve_node_reduce(node_reduce: str, node_aware: bool, nodes: int, ranks_per_node: int) -> bool:
    """Whether `node_reduce` ("fp32", "1bit") runs the 1-bit node step
    (NodeAwareAllreduce::onebit_node_step): "1bit" in the node-aware form
    on N > 1 nodes of R > 1 ranks; elsewhere the fp32 node step (one node:
    nothing is compressed; one rank a node: the flat form)."""
    if node_reduce not in NODE_REDUCES:
        raise ValueError(f"node reduce must be one of {', '.join(NODE_REDUCES)}, got {node_reduce!r}")
    return node_reduce == "1bit" and node_aware and nodes > 1 and ranks_per_node > 1


@dataclass(frozen=True)
class Topology:
    """N nodes of R ranks (P = N R) and the form of the compressed
    collectives (the byte formulas' input). `onebit_node`: the 1-bit
    family's node-aware allreduce reduces inside the node with the first
    half of a 1-bit allreduce (config "topology.node_reduce" "1bit"); it
    holds only where the library runs that step (node-aware, N > 1 and
    R > 1) and is False elsewhere, as the library's fp32 form. Compressed
    ZeRO and FSDP take no notice of it."""
    nodes: int
    ranks_per_node: int
    node_aware: bool = False
    onebit_node: bool = False

    def __post_init__(self):
        if self.onebit_node and not (self.node_aware and self.nodes > 1 and self.ranks_per_node > 1):
            object.__setattr__(self, "onebit_node", False)

    @property
    def world(self) -> int:
        return self.nodes * self.ranks_per_node


def flat_topology(world: int) -> Topology:
    """One node of every rank, flat: every rank's bytes stay inside it."""
    return Topology(1, world, False)
