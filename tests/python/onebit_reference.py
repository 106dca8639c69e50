"""numpy reference of 1-bit Adam and of its compressed allreduce (CAR), from
the docs/optimizers/onebit-adam.md ("1-bit Adam", "The compressed allreduce", "What one step
computes") and of the stabilized compression stage (the applied momentum
clamped to +-L sqrt(v), src/math/onebit_adam.hpp). Every fp32 operation of
the contract is one numpy float32 operation here, in the same order; fused
multiply-adds are computed exactly (``fma32``) and sums of squares follow
the library's fixed order (src/math/sum_squares.hpp), so the results are
meant to match bit for bit.
"""

from dataclasses import dataclass, field
from math import gcd

import numpy as np

F32 = np.float32
SUM_LANES = 256
SUM_BLOCK = 16 * SUM_LANES  # 4096


# ---- fp32 building blocks -----------------------------------------------------


def f32(x):
    return np.asarray(x, dtype=np.float32)


def fma32(a, b, c):
    """fl(a * b + c) with one rounding, for float32 arrays/scalars.

    a*b is exact in float64; the sum s = a*b + c is rounded to double with
    its error from TwoSum. Rounding s to odd when inexact, then to float32,
    gives the correctly rounded result (53 >= 24 + 2 bits)."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    bits = np.asarray(s).view(np.int64)
    fix = (err != 0) & ((bits & 1) == 0) & np.isfinite(s)
    if np.any(fix):
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(fix, np.nextafter(s, toward), s)
    return np.asarray(s).astype(np.float32)


def sum_squares(y) -> float:
    """Sum of y^2 in double in the order of src/math/sum_squares.hpp: blocks
    of 4096; in a block, lane j adds y[j]^2, y[j+256]^2, ...; lanes combined
    by the tree lane[j] += lane[j+s], s = 128..1; block sums in order."""
    y = np.asarray(y, dtype=np.float32).ravel()
    n = y.size
    if n == 0:
        return 0.0
    blocks = -(-n // SUM_BLOCK)
    sq = np.zeros(blocks * SUM_BLOCK, np.float64)
    sq[:n] = y.astype(np.float64) ** 2
    sq = sq.reshape(blocks, SUM_BLOCK // SUM_LANES, SUM_LANES)
    lanes = sq[:, 0, :].copy()
    for k in range(1, sq.shape[1]):
        lanes += sq[:, k, :]
    s = SUM_LANES // 2
    while s >= 1:
        lanes[:, :s] += lanes[:, s:2 * s]
        s //= 2
    total = 0.0
    for b in lanes[:, 0]:
        total += float(b)
    return total


# ---- the compressed allreduce -------------------------------------------------


def padded_length(n: int, world: int) -> int:
    """DeepSpeed's n': unit = P * lcm(P, 8), n rounded up to a multiple."""
    unit = world * (8 * world // gcd(world, 8))
    return n if n % unit == 0 else n + unit - n % unit


def car_scale(y, length: int):
    """C3: fl(fl(sqrt(sum y^2)) / fl(sqrt(double(length))))."""
    return F32(F32(np.sqrt(sum_squares(y))) / F32(np.sqrt(float(length))))


def sign_error(y, s):
    """y - s * sign(y) (sign(v) = -1 iff v < 0): one rounding."""
    y = f32(y)
    return np.where(y < 0, y + s, y - s).astype(np.float32)


def sign_bits(y):
    """1 iff !(y < 0) (so +0, -0 and NaN give 1)."""
    return ~(f32(y) < 0)


@dataclass
class CarWire:
    """What one CAR call of one tensor put on the wire (for the tests)."""

    worker_bytes: list = field(default_factory=list)   # per rank: n'/8 packed bytes
    worker_scales: list = field(default_factory=list)  # per rank: s_w
    server_bytes: list = field(default_factory=list)   # per rank j: c/8 bytes of chunk j
    server_scales: list = field(default_factory=list)  # per rank j: s_s


class CarReference:
    """Errors of one tensor on every rank; ``run`` is one CAR call."""

    def __init__(self, n: int, world: int):
        self.n, self.world = n, world
        self.padded = padded_length(n, world)
        self.chunk = self.padded // world
        self.ew = [np.zeros(self.padded, np.float32) for _ in range(world)]
        self.es = [np.zeros(self.chunk, np.float32) for _ in range(world)]

    def reset(self):
        for e in self.ew + self.es:
            e[:] = 0

    def reduce_scatter(self, xs):
        """The first half of ``run``: the worker errors updated, and for
        every chunk j the weighted sum of the decoded worker signs (the
        server's z before its error is added). Returns (sums, wire)."""
        P, n, npad, c = self.world, self.n, self.padded, self.chunk
        wire = CarWire()
        bits = []
        for r in range(P):
            y = self.ew[r].copy()
            y[:n] = f32(xs[r]).ravel() + self.ew[r][:n]
            s = car_scale(y, npad)
            self.ew[r] = sign_error(y, s)
            b = sign_bits(y)
            bits.append(b)
            wire.worker_bytes.append(np.packbits(b))
            wire.worker_scales.append(s)
        inv = F32(1.0) / F32(P)
        weights = [F32(s * inv) for s in wire.worker_scales]
        sums = []
        for j in range(P):
            acc = np.zeros(c, np.float32)
            for i in range(P):
                u = bits[i][j * c:(j + 1) * c]
                acc = (acc + np.where(u, weights[i], -weights[i]).astype(np.float32)).astype(np.float32)
            sums.append(acc)
        return sums, wire

    def run(self, xs):
        """xs: this tensor's input on every rank. Returns (output, wire)."""
        P, n, npad, c = self.world, self.n, self.padded, self.chunk
        sums, wire = self.reduce_scatter(xs)
        out = np.empty(npad, np.float32)
        for j in range(P):
            z = (sums[j] + self.es[j]).astype(np.float32)
            ss = car_scale(z, c)
            self.es[j] = sign_error(z, ss)
            sb = sign_bits(z)
            wire.server_bytes.append(np.packbits(sb))
            wire.server_scales.append(ss)
            out[j * c:(j + 1) * c] = np.where(sb, ss, -ss)
        return out[:n].copy(), wire


# ---- 1-bit Adam -------------------------------------------------------------------


@dataclass
class Group:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    non_freeze: bool = False


def groups_from_config(config: dict) -> list:
    p = config["optimizer"].get("params", {})
    base = Group()
    for key in ("lr", "eps", "weight_decay"):
        if key in p:
            setattr(base, key, p[key])
    if "betas" in p:
        base.beta1, base.beta2 = p["betas"]
    out = []
    for overrides in config.get("param_groups", [{}]):
        g = Group(**vars(base))
        for key, value in overrides.items():
            if key == "betas":
                g.beta1, g.beta2 = value
            else:
                setattr(g, key, value)
        out.append(g)
    return out


def _to_param_dtype(master, kind):
    if kind == "fp16":
        return master.astype(np.float16)
    if kind == "bf16":
        from halfprec import to_bf16_bits

        return to_bf16_bits(master)
    return master.copy()


def _from_param(value, kind):
    if kind == "fp16":
        return np.asarray(value, np.float16).astype(np.float32)
    if kind == "bf16":
        from halfprec import bf16_bits_to_float

        return bf16_bits_to_float(value)
    return np.asarray(value, np.float32).copy()


def average(per_rank, inv):
    """G3: fp32 sum over ranks in rank order, then times fl(1/P)."""
    total = per_rank[0].copy()
    for g in per_rank[1:]:
        total = (total + g).astype(np.float32)
    return (total * inv).astype(np.float32)


def prepare_grads(opt, grads_per_rank, compressing):
    """The step pipeline (docs/optimizers/adam.md steps 1-4; G3, G4, G6) for an optimizer
    reference with world, clip, report_norm and loss_scale: None when some
    rank's gradient is not finite (the step is skipped), else (local fp32
    gradients per rank, averaged gradients, the reported norm, the fp32
    multiplier fl(coef / loss_scale)). Compressed steps clip by
    sqrt(mean_i ||g_i||^2)."""
    P = opt.world
    count = len(grads_per_rank[0])
    local = [[f32(g).ravel() for g in grads] for grads in grads_per_rank]
    if any(not np.all(np.isfinite(g)) for grads in local for g in grads):
        return None
    inv = F32(1.0) / F32(P)
    averaged = [average([local[r][i] for r in range(P)], inv) for i in range(count)] if P > 1 else local[0]
    norm = -1.0
    coef = 1.0
    if opt.clip > 0.0 or opt.report_norm:
        if compressing and P > 1:
            sumsq = sum(sum(sum_squares(g) for g in local[r]) for r in range(P)) / P
        elif P > 1:
            sumsq = sum_squares(np.concatenate(averaged))
        else:
            sumsq = sum(sum_squares(g) for g in local[0])
        norm = float(np.sqrt(sumsq)) / opt.loss_scale
        if opt.clip > 0.0:
            coef = min(1.0, opt.clip / (norm + 1e-6))
    return local, averaged, norm, F32(coef / opt.loss_scale)


def stabilized_momentum(m, v, limit):
    """The momentum the stabilized rule applies (src/math/stabilized_momentum.hpp):
    m clamped to [-bound, bound], bound = fl(sqrt(v) * L), with x86 max/min
    semantics (the second operand when the comparison is false); limit None:
    m as it is (DeepSpeed's rule)."""
    if limit is None:
        return m
    bound = (np.sqrt(v) * limit).astype(np.float32)
    low = (bound * F32(-1.0)).astype(np.float32)
    used = np.where(m > low, m, low)
    return np.where(used < bound, used, bound).astype(np.float32)


def bias_consts(beta1, beta2, t, variance_updates, bias_correction):
    """The bias correction of a 1-bit Adam / 0/1 Adam update (src/math/onebit_adam.hpp):
    scale = float(1 / (1 - beta1^t)) multiplies the momentum, rbc2 =
    float(1 / sqrt(1 - beta2^K)) the root of v after K variance updates
    (counts below 1 taken as 1), in double from the fp32 betas; both 1
    without bias correction (DeepSpeed's rule)."""
    if not bias_correction:
        return dict(scale=F32(1.0), rbc2=F32(1.0))
    t, k = max(int(t), 1), max(int(variance_updates), 1)
    return dict(scale=F32(1.0 / (1.0 - float(beta1) ** float(t))),
                rbc2=F32(1.0 / np.sqrt(1.0 - float(beta2) ** float(k))))


def denominator(v, c):
    """fl(sqrt(v) * rbc2 + eps) in one fma: sqrt(v) + eps when rbc2 is 1."""
    return fma32(np.sqrt(v).astype(np.float32), c["rbc2"], c["eps"])


def units_limit(limit, c):
    """The clamp before compression in the update's units: the stabilized
    bound of an uncorrected momentum, fl(limit / scale) (None: not clamped)."""
    return None if limit is None else F32(F32(limit) / c["scale"])


def to_update_units(x, v, c, limit):
    """x clamped to units_limit(limit, c) times sqrt(v), divided by
    denominator(v, c): what the stabilized rule compresses."""
    x = stabilized_momentum(x, v, units_limit(limit, c))
    return (x / denominator(v, c)).astype(np.float32)


def momentum_limit(stabilize_limit, beta2, frozen_after):
    """L = float(limit / sqrt(1 - beta2^K)) in double, K < 1 taken as 1."""
    b2t = float(beta2) ** float(max(frozen_after, 1))
    return F32(stabilize_limit / np.sqrt(1.0 - b2t))


class OneBitAdamReference:
    """Data-parallel 1-bit Adam on ``world`` ranks, as docs/optimizers/onebit-adam.md computes it.

    ``params``: initial parameter arrays (float32, float16, or uint16 bf16
    bits with kind "bf16"); ``kinds``: "fp32"/"fp16"/"bf16" per parameter.
    ``step(grads_per_rank)`` takes every rank's local fp32 gradients and
    returns a dict like the step info (compressed, skipped, step, grad_norm).
    """

    def __init__(self, config: dict, params, world: int, *, group_of=None, kinds=None, loss_scale=1.0):
        p = config["optimizer"].get("params", {})
        self.world = world
        self.freeze_step = int(p.get("freeze_step", 100000))
        self.stabilize = bool(p.get("stabilize", True))
        self.stabilize_limit = float(p.get("stabilize_limit", 4.0))  # the library's default
        self.bias_correction = bool(p.get("bias_correction", True))
        # the stabilized rule compresses the momentum in the update's units: m / d
        self.update_units = self.stabilize
        self.frozen_after = 0   # K: warmup updates when v was frozen (0 in warmup)
        self.clamped = 0        # momenta clamped where v > 0 (where L matters), before compression or
                                # when applied, summed over updates and ranks
        self.clip = float(config.get("gradient_clipping", 0.0))
        self.report_norm = bool(config.get("report_grad_norm", False))
        self.loss_scale = float(loss_scale)  # static: the scale the gradients carry
        self.groups = groups_from_config(config)
        self.group_of = list(group_of) if group_of is not None else [0] * len(params)
        self.kinds = list(kinds) if kinds is not None else ["fp32"] * len(params)
        self.master = [_from_param(x, k).ravel() for x, k in zip(params, self.kinds)]
        self.m = [np.zeros_like(x) for x in self.master]
        self.v = [np.zeros_like(x) for x in self.master]
        self.masks = [None] * len(params)
        self.updates = 0
        self.compression = False
        self.cars = None  # per parameter CarReference (compressed tensors), made on entering compression

    # -- public --------------------------------------------------------------
    def params(self):
        """Parameters in their own dtype (fp16 arrays, bf16 bits, fp32)."""
        return [_to_param_dtype(m, k) for m, k in zip(self.master, self.kinds)]

    def set_mask(self, index, mask):
        self.masks[index] = None if mask is None else f32(mask).ravel().copy()

    def compressed_indices(self):
        return [i for i, g in enumerate(self.group_of) if not self.groups[g].non_freeze]

    def enter_compression(self, warmup_updates):
        self.compression = True
        self.frozen_after = warmup_updates

    def momentum_limit(self, group):
        return momentum_limit(self.stabilize_limit, self.groups[group].beta2, self.frozen_after)

    def reset_errors(self):
        if self.cars is not None:
            for car in self.cars.values():
                car.reset()

    def step(self, grads_per_rank):
        P = self.world
        count = len(self.master)
        compressing = self.compression
        prepared = prepare_grads(self, grads_per_rank, compressing)
        if prepared is None:
            return dict(skipped=True, compressed=False, step=self.updates, grad_norm=-1.0,
                        stage_compression=self.compression)
        local, averaged, norm, mul = prepared

        if compressing and self.cars is None:
            self.cars = {i: CarReference(self.master[i].size, P) for i in self.compressed_indices()}

        # momentum for the compressed tensors, per rank, then CAR
        new_m = {}
        if compressing:
            per_rank = {}
            for i in self.compressed_indices():
                c = self._consts(i, self.updates + 1, self.frozen_after)
                per_rank[i] = []
                for r in range(P):
                    g = (local[r][i] * mul).astype(np.float32)
                    m = (self.m[i] * c["beta1"]).astype(np.float32)
                    per_rank[i].append(fma32(g, c["omb1"], m))
            for i, ms in per_rank.items():
                if P > 1 and self.update_units:
                    c = self._consts(i, self.updates + 1, self.frozen_after)
                    limit = self.momentum_limit(self.group_of[i]) if self.stabilize else None
                    if limit is not None:  # the clamp before compression, where L matters
                        bound = units_limit(limit, c)
                        self.clamped += sum(int(np.count_nonzero((stabilized_momentum(m, self.v[i], bound) != m)
                                                                 & (self.v[i] > 0))) for m in ms)
                    out, _ = self.cars[i].run([to_update_units(m, self.v[i], c, limit) for m in ms])
                    out = (out * denominator(self.v[i], c)).astype(np.float32)
                elif P > 1:
                    out, _ = self.cars[i].run(ms)
                else:
                    out = ms[0]
                if self.masks[i] is not None:
                    out = (out * self.masks[i]).astype(np.float32)
                new_m[i] = out

        t = self.updates + 1
        for i in range(count):
            if compressing and i in new_m:
                c = self._consts(i, t, self.frozen_after)
                self.m[i] = new_m[i]
                limit = self.momentum_limit(self.group_of[i]) if self.stabilize else None
                used = self._clamp(self.corrected(self.m[i], c), self.v[i], limit)
                self.master[i] = self._apply(self.master[i], used, self.v[i], c)
            else:
                c = self._consts(i, t, t)
                g = (averaged[i] * mul).astype(np.float32)
                m = (self.m[i] * c["beta1"]).astype(np.float32)
                self.m[i] = fma32(g, c["omb1"], m)
                v = (self.v[i] * c["beta2"]).astype(np.float32)
                self.v[i] = fma32((g * g).astype(np.float32), c["omb2"], v)
                self.master[i] = self._apply(self.master[i], self.corrected(self.m[i], c), self.v[i], c)

        self.updates += 1
        if not compressing and self.updates + 1 >= self.freeze_step:
            self.enter_compression(self.updates)
        return dict(skipped=False, compressed=compressing, step=self.updates, grad_norm=norm,
                    stage_compression=compressing)

    # -- internals -----------------------------------------------------------
    def _consts(self, i, t, variance_updates):
        """Constants of update t of parameter i whose v has had
        `variance_updates` updates (bias_consts)."""
        g = self.groups[self.group_of[i]]
        beta1, beta2 = F32(g.beta1), F32(g.beta2)
        c = dict(beta1=beta1, beta2=beta2, omb1=F32(F32(1.0) - beta1), omb2=F32(F32(1.0) - beta2),
                 eps=F32(g.eps), wd=F32(g.weight_decay), step_size=F32(-F32(g.lr)))
        c.update(bias_consts(beta1, beta2, t, variance_updates, self.bias_correction))
        return c

    @staticmethod
    def corrected(m, c):
        """The bias-corrected momentum fl(m * scale) (m itself with scale 1)."""
        return (m * c["scale"]).astype(np.float32)

    def _clamp(self, m, v, limit):
        """The momentum the stabilized rule applies: m clamped to [-bound,
        bound], bound = fl(sqrt(v) * L), with x86 max/min semantics (the
        second operand when the comparison is false); m itself is kept."""
        used = stabilized_momentum(m, v, limit)
        self.clamped += int(np.count_nonzero((used != m) & (v > 0)))
        return used

    @staticmethod
    def _apply(p, m, v, c):
        u = (m / denominator(v, c)).astype(np.float32)
        if c["wd"] > 0:
            u = fma32(c["wd"], p, u)
        return fma32(c["step_size"], u, p)


def grid_grads(rng, sizes, scale_bits=10, max_units=1000):
    """fp32 gradients on a coarse grid (integers times 2^-scale_bits, |k| <=
    max_units): their sums over ranks, their squares and sums of squares are
    exact in any order, so the reference does not depend on how MPI orders
    its reductions."""
    return [(rng.integers(-max_units, max_units + 1, n).astype(np.float64) * 2.0 ** -scale_bits)
            .astype(np.float32) for n in sizes]
