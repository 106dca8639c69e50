"""1-bit Adam runs shared by the multi-rank script (mpi_onebit.py) and the
tests (test_onebit_adam.py): scenarios, their data (every rank's gradients
can be regenerated anywhere), a parser of dsopt state blobs, and helpers
that drive a dsopt.Optimizer and the reference side by side."""

import copy
import dataclasses
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

import dsopt
from halfprec import to_bf16_bits
from onebit_reference import OneBitAdamReference, grid_grads, padded_length


@dataclass
class Scenario:
    name: str
    config: dict
    sizes: list
    kinds: list = None           # "fp32" / "fp16" / "bf16" per parameter
    groups: list = None          # group index per parameter (None: all 0)
    steps: int = 12
    seed: int = 1
    masks: dict = field(default_factory=dict)  # param index -> mask kind
    poison: dict = field(default_factory=dict)  # step -> rank (mod P) whose gradient gets a NaN/Inf
    cold: dict = field(default_factory=dict)    # param index -> leading elements with zero gradient in warmup

    def __post_init__(self):
        if self.kinds is None:
            self.kinds = ["fp32"] * len(self.sizes)


def onebit_config(freeze_step=4, lr=1e-2, **params):
    p = {"lr": lr, "freeze_step": freeze_step}
    p.update(params)
    return {"optimizer": {"type": "OneBitAdam", "params": p}, "threads": 1}


def with_top(config, **top):
    out = dict(config)
    out.update(top)
    return out


SIZES = [1000, 7, 33, 4097, 64]


def deepspeed_config(**kw):
    """DeepSpeed's rule ("stabilize": false, "bias_correction": false): the parity runs."""
    return onebit_config(stabilize=False, bias_correction=False, **kw)


SCENARIOS = [
    Scenario("plain", deepspeed_config(), SIZES),
    Scenario("weight_decay", with_top(deepspeed_config(weight_decay=0.01, betas=[0.8, 0.99]),
                                      param_groups=[{}, {"lr": 3e-3, "weight_decay": 0.1}]),
             SIZES, groups=[0, 1, 0, 1, 1], seed=2),
    Scenario("mask", deepspeed_config(weight_decay=0.01), SIZES, masks={0: "thirds", 3: "half"}, seed=3),
    Scenario("non_freeze", with_top(deepspeed_config(), param_groups=[{}, {"non_freeze": True}]),
             SIZES, groups=[0, 1, 0, 0, 1], seed=4),
    Scenario("fp16", deepspeed_config(weight_decay=0.01), SIZES, kinds=["fp16", "fp16", "fp32", "fp16", "fp32"],
             seed=5),
    Scenario("bf16", deepspeed_config(), SIZES, kinds=["bf16"] * 5, seed=6),
    Scenario("clipping", with_top(deepspeed_config(), gradient_clipping=2.0), SIZES, seed=7),
    Scenario("freeze_step_1", deepspeed_config(freeze_step=1), SIZES, steps=4, seed=8),
    # a non-finite gradient on one rank, in warmup and in compression: every rank skips
    Scenario("skip", deepspeed_config(), SIZES, steps=10, seed=10, poison={1: 1, 5: 0, 6: 1}),
    # static loss scaling: gradients arrive times the scale
    Scenario("loss_scale", with_top(deepspeed_config(), fp16={"enabled": True, "loss_scale": 1024},
                                    gradient_clipping=5.0),
             SIZES, kinds=["fp16", "fp32", "fp16", "fp16", "fp32"], seed=11),
    # one large tensor: compressed steps send about 32x less than warmup steps
    # (on 2 threads: the sums of squares do not depend on the thread count)
    Scenario("large", with_top(deepspeed_config(freeze_step=2), threads=2), [1 << 18, 1000], steps=3, seed=9),
]


COLD = 40


def stabilized(sc: Scenario, seed: int) -> Scenario:
    """The scenario on the default rule (the stabilized compression stage,
    bias correction), with its own data, and parameter 0's first COLD
    elements never updated in warmup: those are where DeepSpeed's rule
    divides by eps. 8 steps (5 compressed) keep the multi-rank runs short."""
    config = copy.deepcopy(sc.config)
    del config["optimizer"]["params"]["stabilize"]
    del config["optimizer"]["params"]["bias_correction"]
    return dataclasses.replace(sc, name="stable_" + sc.name, config=config, seed=seed, steps=8, cold={0: COLD})


# Bias correction without the clamp.
SCENARIOS.append(Scenario("bias_corrected", onebit_config(stabilize=False, weight_decay=0.01), SIZES, seed=12))
SCENARIOS += [stabilized(sc, 20 + sc.seed) for sc in SCENARIOS
              if sc.name in ("plain", "weight_decay", "mask", "non_freeze", "fp16", "bf16", "clipping")]
# The scenarios whose blobs are saved and resumed (after 2 updates: warmup;
# 3: the transition, the next update is the first compressed one; 6:
# compression); the first also across world sizes.
RESUME = ("stable_weight_decay", "weight_decay", "fp16", "mask")
SAVE_AFTER = (2, 3, 6)
BY_NAME = {s.name: s for s in SCENARIOS}


def make_mask(kind, n):
    i = np.arange(n)
    if kind == "thirds":
        return (i % 3 != 0).astype(np.float32)
    if kind == "half":
        return (i < n // 2).astype(np.float32)
    raise ValueError(kind)


def initial_params(sc: Scenario):
    rng = np.random.default_rng([sc.seed, 12345])
    out = []
    for n, kind in zip(sc.sizes, sc.kinds):
        x = rng.standard_normal(n)
        if kind == "fp16":
            out.append(x.astype(np.float16))
        elif kind == "bf16":
            out.append(to_bf16_bits(x.astype(np.float32)))
        else:
            out.append(x.astype(np.float32))
    return out


def loss_scale_of(sc: Scenario) -> float:
    fp16 = sc.config.get("fp16", {})
    return float(fp16.get("loss_scale", 1.0)) if fp16.get("enabled") else 1.0


def warmup_steps(sc: Scenario) -> int:
    """Steps before the first compressed one (no skipped steps)."""
    return max(sc.config["optimizer"]["params"]["freeze_step"], 2) - 1


def grads_for(sc: Scenario, step: int, rank: int, world: int = 1, *, warmup=warmup_steps, salt=()):
    """This rank's gradients of a step, times the (static) loss scale; zero
    on the cold elements during the first ``warmup(sc)`` steps; a NaN or Inf
    where the scenario poisons the step on this rank. ``salt`` varies the
    data between optimizers' scenario sets."""
    g = grid_grads(np.random.default_rng([sc.seed, step, rank, *salt]), sc.sizes)
    g = [(x * np.float32(loss_scale_of(sc))).astype(np.float32) for x in g]
    if step < warmup(sc):
        for i, n in sc.cold.items():
            g[i][:n] = 0
    if step in sc.poison and sc.poison[step] % world == rank:
        g[step % len(g)][3 % g[step % len(g)].size] = np.nan if step % 2 else np.inf
    return g


def as_dsopt_params(params, kinds):
    return [dsopt.bf16(p) if k == "bf16" else p for p, k in zip(params, kinds)]


def reference_for(sc: Scenario, world: int) -> OneBitAdamReference:
    ref = OneBitAdamReference(sc.config, initial_params(sc), world, group_of=sc.groups, kinds=sc.kinds,
                              loss_scale=loss_scale_of(sc))
    for i, kind in sc.masks.items():
        ref.set_mask(i, make_mask(kind, sc.sizes[i]))
    return ref


def run_dsopt(sc: Scenario, comm, rank, world, *, save_after=(), steps=None):
    """Runs the scenario on this rank. Returns (params, infos, final blob,
    {update count: (blob, params copy)} for the counts in save_after)."""
    params = initial_params(sc)
    saved = {}
    infos = []
    with dsopt.Optimizer(sc.config, as_dsopt_params(params, sc.kinds), comm=comm, groups=sc.groups) as opt:
        for i, kind in sc.masks.items():
            opt.set_momentum_mask(i, make_mask(kind, sc.sizes[i]))
        for k in range(sc.steps if steps is None else steps):
            infos.append(opt.step(grads_for(sc, k, rank, world)))
            if k + 1 in save_after:
                saved[k + 1] = (opt.state_dict(), [p.copy() for p in params])
        blob = opt.state_dict()
    return params, infos, blob, saved


def info_rows(infos):
    """Step infos as an int64/float64 table for npz files."""
    return np.array([[i.skipped, i.compressed, i.step, i.bytes_sent, i.grad_norm] for i in infos],
                    dtype=np.float64).reshape(-1, 5)


# ---- state blobs ------------------------------------------------------------------


@dataclass
class Blob:
    algorithm: str
    world: int
    rank: int
    params: list        # (numel, dtype, group)
    sections: dict      # name -> bytes

    def floats(self, name):
        return np.frombuffer(self.sections[name], np.float32)

    def stage(self):
        """(compressing, freeze_step, world of the errors) of a 1-bit Adam blob."""
        return struct.unpack("<iqi", self.sections["onebit.stage"])

    def frozen_after(self):
        """K of the stabilized rule: warmup updates when v was frozen (0 in warmup)."""
        return struct.unpack("<q", self.sections["onebit.stabilize"])[0]


def parse_blob(data: bytes) -> Blob:
    """The layout of src/state/blob.hpp, checksum verified."""
    data = bytes(data)
    assert data[:8] == b"DSOPTST\0", "bad magic"
    version, _, total = struct.unpack_from("<IIQ", data, 8)
    assert version == 1 and total == len(data)
    assert zlib.crc32(data[:-4]) == struct.unpack_from("<I", data, len(data) - 4)[0], "bad CRC"
    pos = 24

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        (n,) = take("<I")
        s = data[pos:pos + n]
        pos += n
        return s.decode()

    algorithm = string()
    world, rank = take("<II")
    (count,) = take("<Q")
    params = [take("<qii") for _ in range(count)]
    (nsections,) = take("<I")
    sections = {}
    for _ in range(nsections):
        name = string()
        (n,) = take("<Q")
        sections[name] = data[pos:pos + n]
        pos += n
    assert pos == len(data) - 4
    return Blob(algorithm, world, rank, params, sections)


def reference_state(ref: OneBitAdamReference, rank: int):
    """What the blob of `rank` should hold: m and v (all parameters back to
    back), the worker and server errors of the compressed parameters."""
    m = np.concatenate(ref.m)
    v = np.concatenate(ref.v)
    if ref.cars is None or ref.world == 1:
        return m, v, np.zeros(0, np.float32), np.zeros(0, np.float32)
    ew = np.concatenate([ref.cars[i].ew[rank] for i in ref.compressed_indices()])
    es = np.concatenate([ref.cars[i].es[rank] for i in ref.compressed_indices()])
    return m, v, ew, es


def warmup_bytes(sc: Scenario, world: int) -> int:
    n = sum(sc.sizes)
    return 2 * (world - 1) * 4 * (n + 1) // world


def handshake_bytes(world: int) -> int:
    """The 16-byte allreduce that starts every collective dsopt call (the
    ranks agree they are in the same call)."""
    return 2 * (world - 1) * 16 // world


def replication_check_bytes(world: int, step: int, skipped: bool) -> int:
    """The 16-byte allreduce that compares hashes of the ranks' gradients
    (StepInfo.grads_replicated) in a step made while fewer than 3 updates
    had been applied (`step`: updates applied, this one included)."""
    return handshake_bytes(world) if step - (0 if skipped else 1) < 3 else 0


def step_bytes(sc: Scenario, world: int, ref_info: dict) -> int:
    """Bytes of one step as the reference ran it: the handshake and on the
    first steps the gradient hash comparison, then (a skipped step stops
    after the collective that found the non-finite value: warmup, the
    gradient allreduce; compression, the status allreduce)."""
    return (handshake_bytes(world) + replication_check_bytes(world, ref_info["step"], ref_info["skipped"])
            + _step_bytes(sc, world, ref_info))


def _step_bytes(sc: Scenario, world: int, ref_info: dict) -> int:
    if not ref_info["stage_compression"]:
        return warmup_bytes(sc, world)
    if ref_info["skipped"]:
        groups = sc.groups or [0] * len(sc.sizes)
        pg = sc.config.get("param_groups", [{}])
        full = [n for n, g in zip(sc.sizes, groups) if pg[g].get("non_freeze", False)]
        if world == 1:
            return 0
        return 2 * (world - 1) * (4 * (sum(full) + 1) if full else 16) // world
    return compressed_bytes(sc, world)


def compressed_bytes(sc: Scenario, world: int) -> int:
    """Per compressed step: the 16-byte control allreduce (status, norm),
    the non_freeze groups' gradient allreduce (+ status float, in place of
    the control one unless a norm is needed: clipping, report_grad_norm or
    the divergence check, on by default), and the CAR of the rest."""
    P = world
    if P == 1:
        return 0
    groups = sc.groups or [0] * len(sc.sizes)
    pg = sc.config.get("param_groups", [{}])
    nf = [pg[g].get("non_freeze", False) for g in groups]
    comp = [n for n, f in zip(sc.sizes, nf) if not f]
    full = [n for n, f in zip(sc.sizes, nf) if f]
    wants_norm = (sc.config.get("gradient_clipping", 0) > 0 or sc.config.get("report_grad_norm", False)
                  or sc.config.get("divergence_check", {}).get("enabled", True))
    total = 0
    if full:
        total += 2 * (P - 1) * 4 * (sum(full) + 1) // P
    if not full or (comp and wants_norm):
        total += 2 * (P - 1) * 16 // P
    if comp:
        padded = sum(padded_length(n, P) for n in comp)
        total += (P - 1) * padded // (4 * P) + 8 * (P - 1) * len(comp)
    return total


def resume_run(sc: Scenario, comm, rank, blob, params_at_save, start: int, world: int = 1):
    """A fresh optimizer that loads `blob` (saved after `start` updates) and
    runs the scenario's remaining steps. fp32 parameters start from their
    values at the save (the caller owns them); 16-bit ones from zeros (the
    blob's masters restore them). Masks are set again (blobs do not hold
    them). Returns (params, infos, blob right after loading, final blob)."""
    params = [p.copy() if k == "fp32" else np.zeros_like(p) for p, k in zip(params_at_save, sc.kinds)]
    infos = []
    with dsopt.Optimizer(sc.config, as_dsopt_params(params, sc.kinds), comm=comm, groups=sc.groups) as opt:
        for i, kind in sc.masks.items():
            opt.set_momentum_mask(i, make_mask(kind, sc.sizes[i]))
        opt.load_state_dict(blob)
        loaded = opt.state_dict()
        for k in range(start, sc.steps):
            infos.append(opt.step(grads_for(sc, k, rank, world)))
        final = opt.state_dict()
    return params, infos, loaded, final


def save_npz(path, params, infos, **blobs):
    arrays = {f"p{i}": p for i, p in enumerate(params)}
    arrays["infos"] = info_rows(infos)
    for name, b in blobs.items():
        arrays[name] = np.frombuffer(b, np.uint8)
    np.savez(path, **arrays)


def load_npz(path, count):
    """(params, info table, {blob name: bytes}) of a save_npz file."""
    with np.load(path) as z:
        params = [z[f"p{i}"] for i in range(count)]
        infos = z["infos"]
        blobs = {k: z[k].tobytes() for k in z.files if k != "infos" and not k.startswith("p")}
    return params, infos, blobs
