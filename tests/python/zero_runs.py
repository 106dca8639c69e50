"""ZeRO stage 1/2 scenarios for mpi_zero.py and test_zero.py: the model
(odd sizes, so that shards split tensors and padding is exercised), the
config, and a driver that steps one dsopt.Optimizer with rank-dependent
gradients.

"exact" gradients are multiples of 1/256 in [-1/4, 1/4] (times the loss
scale): their sums over ranks are exact in fp32 in any order, so ZeRO and
stage 0 must agree bit for bit at every world size. "random" gradients are
normal floats: their sums depend on the reduction order, which MPI chooses
differently for allreduce (stage 0) and reduce-scatter (ZeRO) from three
ranks on."""

from dataclasses import dataclass, field

import numpy as np

import dsopt
from halfprec import to_bf16_bits


@dataclass
class Scenario:
    name: str
    sizes: tuple = (37, 1000, 3, 513, 64)
    kinds: tuple = ("fp32",) * 5
    groups: tuple = (0, 1, 0, 1, 0)
    grads: str = "exact"           # or "random"
    steps: int = 6
    top: dict = field(default_factory=dict)    # top-level config keys
    zero: dict = field(default_factory=lambda: {"reduce_bucket_size": 96,
                                                "allgather_bucket_size": 200})
    overflow: tuple = ()          # (step, rank): that rank's gradient is Inf then
    seed: int = 7
    opt_type: str = "AdamW"


SCENARIOS = [
    Scenario("fp32"),
    Scenario("fp32_random", grads="random"),
    Scenario("one_bucket", zero={}),          # DeepSpeed's contiguous shards
    Scenario("allreduce_buckets", zero={"reduce_bucket_size": 96, "reduce_scatter": False}),
    Scenario("fp16_dynamic", kinds=("fp16",) * 5, overflow=(3, 1),
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
    Scenario("bf16", kinds=("bf16",) * 5, top={"bf16": {"enabled": True}}),
    Scenario("mixed_dtypes", kinds=("fp32", "bf16", "fp16", "fp32", "bf16")),
    Scenario("clipping", top={"gradient_clipping": 0.5}),
    # Blocks of >= 64 KiB per rank: the MPI reduce-scatter runs as dsopt's ring.
    Scenario("ring", sizes=(70001, 30011, 5), kinds=("fp32", "bf16", "fp32"), groups=(0, 1, 0),
             grads="random", zero={"reduce_bucket_size": 80000, "allgather_bucket_size": 50000}),
    Scenario("tiny", sizes=(1, 2, 3), groups=(0, 1, 0), kinds=("fp32", "bf16", "fp32"),
             zero={"reduce_bucket_size": 1, "allgather_bucket_size": 1}),
]
# LAMB: tensors of several sum blocks (4096 elements), cut by small buckets
# (most blocks rebuilt across ranks) or by the one-bucket shards (a few).
LAMB_SIZES = (37, 9000, 3, 5000, 64)
SCENARIOS += [
    Scenario("lamb", sizes=LAMB_SIZES, opt_type="Lamb",
             zero={"reduce_bucket_size": 1000, "allgather_bucket_size": 3000}),
    Scenario("lamb_one_bucket", sizes=LAMB_SIZES, opt_type="Lamb", zero={}),
    Scenario("lamb_mixed_dtypes", sizes=LAMB_SIZES, kinds=("fp32", "bf16", "fp16", "fp32", "bf16"),
             opt_type="Lamb", top={"optimizer": {"type": "Lamb", "params": {
                 "lr": 0.01, "weight_decay": 0.01, "bias_correction": False, "max_coeff": 2.0}}}),
    Scenario("lamb_random", sizes=LAMB_SIZES, grads="random", opt_type="Lamb"),
    Scenario("lamb_fp16_dynamic", sizes=LAMB_SIZES, kinds=("fp16",) * 5, overflow=(3, 1), opt_type="Lamb",
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
    Scenario("lamb_tiny", sizes=(1, 2, 3), groups=(0, 1, 0), kinds=("fp32", "bf16", "fp32"), opt_type="Lamb",
             zero={"reduce_bucket_size": 1, "allgather_bucket_size": 1}),
]
# Lion: one moment, the elementwise path of Adam.
SCENARIOS += [
    Scenario("lion", opt_type="Lion"),
    Scenario("lion_random", grads="random", opt_type="Lion"),
    Scenario("lion_mixed_dtypes", kinds=("fp32", "bf16", "fp16", "fp32", "bf16"), opt_type="Lion"),
    Scenario("lion_fp16_dynamic", kinds=("fp16",) * 5, overflow=(3, 1), opt_type="Lion",
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
]
# SGD: one moment, torch.optim.SGD's rule on the elementwise path; one
# group with dampening and L2 decay, the other with Nesterov.
SGD_TOP = {"optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9, "dampening": 0.1,
                                                    "weight_decay": 0.01}},
           "param_groups": [{}, {"lr": 0.02, "weight_decay": 0.0, "dampening": 0.0, "nesterov": True}]}
SCENARIOS += [
    Scenario("sgd", opt_type="SGD", top=SGD_TOP),
    Scenario("sgd_random", grads="random", opt_type="SGD", top=SGD_TOP),
    Scenario("sgd_mixed_dtypes", kinds=("fp32", "bf16", "fp16", "fp32", "bf16"), opt_type="SGD", top=SGD_TOP),
]
BY_NAME = {sc.name: sc for sc in SCENARIOS}


def config(sc: Scenario, stage: int) -> dict:
    cfg = {"optimizer": {"type": sc.opt_type, "params": {"lr": 0.01, "weight_decay": 0.01,
                                                       "betas": [0.8, 0.99]}},
           "param_groups": [{}, {"lr": 0.02, "weight_decay": 0.0}],
           "report_grad_norm": True}
    cfg.update(sc.top)
    if stage:
        cfg["zero_optimization"] = dict(sc.zero, stage=stage)
    return cfg


def initial_params(sc: Scenario):
    return random_params(np.random.default_rng([sc.seed, 1]), sc.sizes, sc.kinds)


def random_params(rng, sizes, kinds):
    """Normal values, one tensor per size, in each kind's dtype (bf16 as
    its bits)."""
    out = []
    for n, kind in zip(sizes, kinds):
        x = rng.standard_normal(n).astype(np.float32)
        out.append({"fp16": lambda: x.astype(np.float16), "bf16": lambda: to_bf16_bits(x)}
                   .get(kind, lambda: x)())
    return out


def as_dsopt(params, kinds):
    return [dsopt.bf16(p) if k == "bf16" else p for p, k in zip(params, kinds)]


def gradients(sc: Scenario, step: int, rank: int, scale: float):
    out = []
    for i, n in enumerate(sc.sizes):
        rng = np.random.default_rng([sc.seed, step, rank, i])
        if sc.grads == "exact":
            g = rng.integers(-64, 65, n).astype(np.float32) / 256
        else:
            g = (rng.standard_normal(n) * (0.5 + i % 3)).astype(np.float32)
        out.append((g * np.float32(scale)).astype(np.float32))
    if sc.overflow and sc.overflow == (step, rank):
        out[-1][0] = np.inf
    return out


def step_all(opt, sc, rank, first, count, history=None):
    """Steps ``count`` times from step index ``first``; returns the infos,
    appending a copy of the parameters after each step to ``history``."""
    infos = []
    for k in range(first, first + count):
        infos.append(opt.step(gradients(sc, k, rank, opt.loss_scale)))
        if history is not None:
            history.append([p.copy() for p in opt_params(opt)])
    return infos


def opt_params(opt):
    return [p.array if hasattr(p, "array") else p for p in opt.params]


def make(sc, stage, comm, params=None):
    params = initial_params(sc) if params is None else params
    return dsopt.Optimizer(config(sc, stage), as_dsopt(params, sc.kinds), comm=comm,
                           groups=list(sc.groups)), params


# An all-bf16 model whose 1440 elements need no padding for P = 1..4.
MEMORY = Scenario("memory", sizes=(1001, 437, 2), kinds=("bf16",) * 3, groups=(0, 1, 0),
                  top={"bf16": {"enabled": True}})


# The same model with LAMB in one reduce bucket (DeepSpeed's contiguous shards).
LAMB_MEMORY = Scenario("lamb_memory", sizes=MEMORY.sizes, kinds=MEMORY.kinds, groups=MEMORY.groups,
                       top=MEMORY.top, opt_type="Lamb",
                       zero={"reduce_bucket_size": 1440, "allgather_bucket_size": 200})


def cut_numel(sizes, world: int) -> int:
    """Elements of LAMB's sum blocks (4096 elements from a tensor's start)
    that a one-bucket layout splits between ranks: rebuilt on every rank."""
    shard = sum(sizes) // world
    bounds = [k * shard for k in range(1, world)]
    start, cut = 0, 0
    for n in sizes:
        for b in range(0, n, 4096):
            lo, hi = start + b, start + min(n, b + 4096)
            cut += (hi - lo) if any(lo < x < hi for x in bounds) else 0
        start += n
    return cut


def expected_lamb_host_bytes(sc: Scenario, world: int) -> dict:
    """expected_host_bytes plus LAMB's direction u (4 bytes per element
    kept) and, under ZeRO, the rebuilt blocks of p and u (8 bytes per cut
    element)."""
    n, want = sum(sc.sizes), expected_host_bytes(sc, world)
    shard = n // world
    extra = 8 * cut_numel(sc.sizes, world)
    return {0: want[0] + 4 * n, 1: want[1] + 4 * shard + extra, 2: want[2] + 4 * shard + extra}


def expected_host_bytes(sc: Scenario, world: int) -> dict:
    """dsopt's accounting for MEMORY, from the layout rule (docs/guides/zero.md "ZeRO"):
    stage 0 keeps masters and moments of every element (and, from the first
    step at P > 1, the averaged-gradient buffer with its status element);
    ZeRO keeps masters, moments and the averaged gradient of its shard,
    plus, at P > 1, one scratch buffer for a reduce bucket (fp32) or an
    allgather chunk (every rank's, in the parameters' 2 bytes)."""
    n = sum(sc.sizes)
    assert n % (2 * world) == 0
    shard = n // world
    bucket = min(n, sc.zero["reduce_bucket_size"] // (2 * world) * (2 * world))
    chunk = min(shard, max(1, sc.zero["allgather_bucket_size"] // world))
    # One scratch buffer serves the reduce bucket, then the allgather chunk.
    comm = max(4 * bucket, 2 * chunk * (world + 1)) if world > 1 else 0
    return {0: 12 * n + (4 * (n + 1) if world > 1 else 0), 1: 16 * shard + comm, 2: 16 * shard + comm}
