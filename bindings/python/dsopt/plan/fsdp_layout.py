"""The FSDP2 view of a model (docs/guides/planner.md "FSDP2"): its FSDP
modules, each the shapes of the parameters it shards and whether it
reshards after forward, and how FSDP2 cuts them over a shard group of P
ranks: every tensor by rows (dim 0), padded to a multiple of P, rank r
holding rows [r c, (r+1) c) of the ceil(d0 / P) = c rows a shard has
(fewer, or none, at the end)."""

from dataclasses import dataclass
from math import prod


@dataclass(frozen=True)
class FsdpModule:
    """One ``fully_shard``ed module: the shapes of its own parameters (those
    of no inner FSDP module), and whether it reshards after forward
    (FSDP2's default; not the root module, which keeps its parameters
    gathered from forward to backward)."""
    shapes: tuple
    reshard: bool = True

    def __post_init__(self):
        shapes = tuple(tuple(int(d) for d in s) for s in self.shapes)
        for s in shapes:
            if not s or any(d < 1 for d in s):
                raise ValueError(f"FSDP module: parameter shapes must be non-empty and positive, got {s!r}")
        object.__setattr__(self, "shapes", shapes)

    @property
    def numel(self) -> int:
        return sum(prod(s) for s in self.shapes)

    def shard_numel(self, ranks: int) -> int:
        """m: the module's padded shard per rank, what its reduce-scatter
        gives each rank and its all-gather takes from each
        (``Compression.shard_numels``): sum over its tensors of
        ceil(d0 / P) x (the elements of a row)."""
        return sum(shard_rows(s[0], ranks) * prod(s[1:]) for s in self.shapes)

    def local_sizes(self, ranks: int, rank: int) -> list:
        """The elements of each of its tensors that rank `rank` holds (0: none)."""
        return [local_rows(s[0], ranks, rank) * prod(s[1:]) for s in self.shapes]


def shard_rows(rows: int, ranks: int) -> int:
    return -(-rows // ranks)


def local_rows(rows: int, ranks: int, rank: int) -> int:
    c = shard_rows(rows, ranks)
    return max(0, min(rows, (rank + 1) * c) - rank * c)


def default_modules(sizes) -> tuple:
    """Without a stated partition: each tensor a module of its own, one
    row of elements per row (a 1-D tensor), resharding after forward; the
    root module holds no parameter of its own."""
    return tuple(FsdpModule(((n,),)) for n in sizes)


def modules_of(model) -> tuple:
    return model.modules if model.modules is not None else default_modules(model.sizes)


def local_sizes(model, ranks: int, rank: int) -> list:
    """Every tensor's elements on rank `rank` of a shard group of `ranks`,
    empty shards left out (what dsopt's optimizer steps on there)."""
    out = []
    for mod in modules_of(model):
        out += [n for n in mod.local_sizes(ranks, rank) if n]
    return out


def groups(config, topo) -> tuple:
    """(S, N) of an FSDP2 or HSDP configuration on `topo`: the shard
    group's ranks and the replicas."""
    if config.path == "hsdp":
        return topo.ranks_per_node, topo.nodes
    return topo.world, 1
