"""numpy reference of 1-bit LAMB, written from docs/design/onebit-lamb.md
section 5 and decisions.md L1-L4, S1: warmup LAMB with the per-tensor trust
ratio and its EMA, the transition (vf = v, scaling_coeff from the momentum
RMS, 1.0 for an all-zero momentum), and the compression stage on one fused
buffer (padding tail kept between steps) through the compressed allreduce.
Every fp32 operation is one numpy float32 operation in the library's
order, fused multiply-adds are exact (fma32), the scalar steps are Python
doubles as in DeepSpeed; the fp32 building blocks, the CAR and the gradient
pipeline come from onebit_reference.py."""

import numpy as np

from onebit_reference import (F32, CarReference, _from_param, _to_param_dtype, denominator, f32, fma32,
                              groups_from_config, momentum_limit, padded_length, prepare_grads,
                              stabilized_momentum, sum_squares, to_update_units)

COEFF_DEFAULTS = dict(max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9, factor_max=4.0, factor_min=0.5,
                      factor_threshold=0.1)


def norm32(sumsq):
    """An fp32 norm from a double sum of squares."""
    return F32(np.sqrt(sumsq))


def warmup_coeff(p_sumsq, u_sumsq, k):
    wn, un = norm32(p_sumsq), norm32(u_sumsq)
    if wn == 0 or un == 0:
        return 1.0
    coeff = float(F32(wn / un))
    coeff = min(coeff, k["max_coeff"])
    return max(coeff, k["min_coeff"])


def compression_factor(max_ratio, u0_sumsq, u_sumsq, decay, last, k):
    factor = float(max_ratio)
    if decay:
        ratio = min(1.0, float(F32(norm32(u0_sumsq) / norm32(u_sumsq))))
        factor = factor * ratio + (1.0 - ratio)
    factor = min(factor, k["factor_max"])
    factor = max(factor, k["factor_min"])
    factor = min(factor, last * (1.0 + k["factor_threshold"]))
    return max(factor, last * (1.0 - k["factor_threshold"]))


class OneBitLambReference:
    """Data-parallel 1-bit LAMB on ``world`` ranks; the interface of
    OneBitAdamReference (params, set_mask, step(grads_per_rank))."""

    def __init__(self, config: dict, params, world: int, *, group_of=None, kinds=None, loss_scale=1.0):
        p = config["optimizer"].get("params", {})
        self.world = world
        self.freeze_step = int(p.get("freeze_step", 100000))
        self.stabilize = bool(p.get("stabilize", True))
        self.stabilize_limit = float(p.get("stabilize_limit", 4.0))  # the library's default for this type
        self.k = {key: float(p.get(key, d)) for key, d in COEFF_DEFAULTS.items()}
        # the stabilized rule: the momentum compressed in the update's units
        # (P > 1), and the larger of the frozen coefficient times factor and
        # LAMB's trust ratio of the update ("larger"; DeepSpeed's rule:
        # "frozen"; "live", the trust ratio alone, is for the design study)
        self.update_units = self.stabilize
        self.trust_ratio = "larger" if self.stabilize else "frozen"
        self.clip = float(config.get("gradient_clipping", 0.0))
        self.report_norm = bool(config.get("report_grad_norm", False))
        self.loss_scale = float(loss_scale)
        self.groups = groups_from_config(config)
        self.group_of = list(group_of) if group_of is not None else [0] * len(params)
        self.kinds = list(kinds) if kinds is not None else ["fp32"] * len(params)
        self.master = [_from_param(x, k).ravel() for x, k in zip(params, self.kinds)]
        self.m = [np.zeros_like(x) for x in self.master]
        self.v = [np.zeros_like(x) for x in self.master]
        self.vf = [np.zeros_like(x) for x in self.master]
        n = len(self.master)
        self.coeff_freeze = [0.0] * n
        self.last_factor = [1.0] * n
        self.scaling = [1.0] * n
        self.masks = [None] * n
        self.updates = 0
        self.compression = False
        self.frozen_after = 0
        self.total = sum(x.size for x in self.master)
        self.padded = padded_length(self.total, world) if world > 1 else self.total
        self.tail = np.zeros(self.padded - self.total, np.float32)  # L4
        self.car = None

    def params(self):
        return [_to_param_dtype(m, k) for m, k in zip(self.master, self.kinds)]

    def set_mask(self, index, mask):
        self.masks[index] = None if mask is None else f32(mask).ravel().copy()

    def change_world(self, world):
        """Continue at another world size (K2): the errors and the padding
        tail start at zero."""
        self.world = world
        self.padded = padded_length(self.total, world) if world > 1 else self.total
        self.tail = np.zeros(self.padded - self.total, np.float32)
        self.car = None

    def enter_compression(self, warmup_updates):
        self.compression = True
        self.frozen_after = warmup_updates
        self.vf = [v.copy() for v in self.v]
        rms = [float(F32(norm32(sum_squares(m)) / F32(np.sqrt(float(m.size))))) for m in self.m]
        united = 0.0
        for r in rms:
            united += r
        united /= len(rms)
        self.scaling = [1.0 if r == 0.0 else united / r for r in rms]

    def step(self, grads_per_rank):
        compressing = self.compression
        prepared = prepare_grads(self, grads_per_rank, compressing)
        if prepared is None:
            return dict(skipped=True, compressed=False, step=self.updates, grad_norm=-1.0,
                        stage_compression=compressing)
        local, averaged, norm, mul = prepared
        if compressing:
            self._compressed(local, mul)
        else:
            self._warmup(averaged, mul)
        self.updates += 1
        if not compressing and self.updates + 1 >= self.freeze_step:
            self.enter_compression(self.updates)
        return dict(skipped=False, compressed=compressing, step=self.updates, grad_norm=norm,
                    stage_compression=compressing)

    # -- internals -----------------------------------------------------------
    def _consts(self, i):
        g = self.groups[self.group_of[i]]
        beta1, beta2 = F32(g.beta1), F32(g.beta2)
        return dict(beta1=beta1, beta2=beta2, omb1=F32(F32(1.0) - beta1), omb2=F32(F32(1.0) - beta2),
                    eps=F32(g.eps), wd=F32(g.weight_decay), lr=float(g.lr), beta2_double=g.beta2)

    @staticmethod
    def _momentum(m, g, c):
        return fma32(g, c["omb1"], (m * c["beta1"]).astype(np.float32))

    @staticmethod
    def _variance(v, g, c):
        return fma32((g * g).astype(np.float32), c["omb2"], (v * c["beta2"]).astype(np.float32))

    def _limit(self, c):
        """The stabilized rule's L (None with DeepSpeed's rule)."""
        return momentum_limit(self.stabilize_limit, c["beta2_double"], self.frozen_after) if self.stabilize else None

    @staticmethod
    def _units_consts(c):
        """Constants for to_update_units / denominator: no bias correction,
        so d = sqrt(v) + eps."""
        return dict(scale=F32(1.0), rbc2=F32(1.0), eps=c["eps"])

    def _apply(self, i, coeff, u):
        step = F32(-self._consts(i)["lr"] * coeff)
        self.master[i] = fma32(step, u, self.master[i])

    def _warmup(self, averaged, mul):
        for i in range(len(self.master)):
            c = self._consts(i)
            g = (averaged[i] * mul).astype(np.float32)
            self.m[i] = self._momentum(self.m[i], g, c)
            self.v[i] = self._variance(self.v[i], g, c)
            u = (self.m[i] / (np.sqrt(self.v[i]) + c["eps"]).astype(np.float32)).astype(np.float32)
            if c["wd"] > 0:
                u = fma32(c["wd"], self.master[i], u)
            coeff = warmup_coeff(sum_squares(self.master[i]), sum_squares(u), self.k)
            if coeff != 1.0:
                self.coeff_freeze[i] = self.k["coeff_beta"] * self.coeff_freeze[i] + (1.0 - self.k["coeff_beta"]) * coeff
            self._apply(i, coeff, u)

    def _compressed(self, local, mul):
        P, count = self.world, len(self.master)
        units = self.update_units and P > 1
        m_prev = [m.copy() for m in self.m]
        fused = []
        for r in range(P):
            parts = []
            for i in range(count):
                c = self._consts(i)
                m = self._momentum(self.m[i], g=(local[r][i] * mul).astype(np.float32), c=c)
                if units:
                    parts.append(to_update_units(m, self.v[i], self._units_consts(c), self._limit(c)))
                else:
                    parts.append((m * F32(self.scaling[i])).astype(np.float32))
            fused.append(np.concatenate(parts + [self.tail]))
        if P > 1:
            if self.car is None:
                self.car = CarReference(self.padded, P)
            out, _ = self.car.run(fused)
        else:
            out = fused[0]
        self.tail = out[self.total:].copy()
        offset = 0
        for i in range(count):
            c = self._consts(i)
            n = self.master[i].size
            if units:
                m = (out[offset:offset + n] * denominator(self.v[i], self._units_consts(c))).astype(np.float32)
            else:
                m = (out[offset:offset + n] / F32(self.scaling[i])).astype(np.float32)
            offset += n
            mask = self.masks[i] if self.masks[i] is not None else np.ones(n, np.float32)
            m = (m * mask).astype(np.float32)
            self.m[i] = m
            # the stabilized rule reconstructs the gradient from the momenta it applies
            limit = self._limit(c)
            used = stabilized_momentum(m, self.v[i], limit)
            used_prev = stabilized_momentum(m_prev[i], self.v[i], limit)
            gr = (fma32(-c["beta1"], used_prev, used) / c["omb1"]).astype(np.float32)
            self.vf[i] = self._variance(self.vf[i], gr, c)
            denom = (np.sqrt(self.v[i]) + c["eps"]).astype(np.float32)
            u0 = (used / denom).astype(np.float32)
            u = fma32(c["wd"], self.master[i], u0) if c["wd"] > 0 else u0
            ratio = (denom / (np.sqrt(self.vf[i]) + c["eps"]).astype(np.float32)).astype(np.float32)
            factor = compression_factor(ratio.max(), sum_squares(u0), sum_squares(u), c["wd"] > 0,
                                        self.last_factor[i], self.k)
            self.last_factor[i] = factor
            coeff = self.coeff_freeze[i] * factor
            if self.trust_ratio != "frozen":
                live = warmup_coeff(sum_squares(self.master[i]), sum_squares(u), self.k)
                coeff = max(coeff, live) if self.trust_ratio == "larger" else live
            self._apply(i, coeff, u)
