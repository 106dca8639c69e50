"""numpy reference of 0/1 Adam, from docs/design/zero-one-adam.md sections 3
and 4 with dsopt's decisions (decisions.md; docs/optimizers/zero-one-adam.md "0/1 Adam"): G2's counter
k = updates + 1, Z1 (DeepSpeed's weight decay inside the accumulator, or
decoupled_sync_weight_decay), Z2 (one rank: 1-bit steps use the local
gradient), the parameters of the last sync kept so replicas stay
bit-identical, and the stabilized clamp (S1). Every fp32 operation of the C
code is one numpy float32 operation here, in the same order, fma exact.
The CAR, fma and fp32 helpers are onebit_reference's."""

import numpy as np

from onebit_reference import (F32, CarReference, _from_param, _to_param_dtype, bias_consts, denominator, f32,
                              fma32, groups_from_config, sum_squares, to_update_units)

SKIPPED, FULL, COMPRESSED, LOCAL, SYNC = 0, 1, 2, 3, 4


def clamp(x, v, limit):
    """min(max(x, -b), b), b = fl(sqrt(v) * limit), x86 min/max semantics."""
    bound = (np.sqrt(v) * F32(limit)).astype(np.float32)
    low = (bound * F32(-1.0)).astype(np.float32)
    used = np.where(x > low, x, low)
    return np.where(used < bound, used, bound).astype(np.float32)


class ZeroOneAdamReference:
    """0/1 Adam on ``world`` ranks. Phase 2 gives every rank its own
    parameters, momenta and accumulator between syncs, so those are kept per
    rank; v and the parameters of the last sync are common."""

    def __init__(self, config, params, world, *, group_of=None, kinds=None, loss_scale=1.0):
        p = config["optimizer"].get("params", {})
        self.world = world
        self.var_freeze_step = int(p.get("var_freeze_step", 100000))
        self.var_update_scaler = int(p.get("var_update_scaler", 16))
        self.local_step_scaler = int(p.get("local_step_scaler", 32678))
        self.local_step_clipper = int(p.get("local_step_clipper", 16))
        self.decoupled = bool(p.get("decoupled_sync_weight_decay", False))
        self.stabilize = bool(p.get("stabilize", True))
        self.stabilize_limit = float(p.get("stabilize_limit", 4.0))  # the library's default for this type
        self.bias_correction = bool(p.get("bias_correction", True))
        # the stabilized rule compresses gradients and accumulators in the
        # update's units: x / d goes through the compressed allreduce
        self.update_units = self.stabilize
        self.clip = float(config.get("gradient_clipping", 0.0))
        self.report_norm = bool(config.get("report_grad_norm", False))
        self.loss_scale = float(loss_scale)
        self.groups = groups_from_config(config)
        self.group_of = list(group_of) if group_of is not None else [0] * len(params)
        self.kinds = list(kinds) if kinds is not None else ["fp32"] * len(params)
        start = [_from_param(x, k).ravel() for x, k in zip(params, self.kinds)]
        self.master = [[x.copy() for x in start] for _ in range(world)]
        self.m = [[np.zeros_like(x) for x in start] for _ in range(world)]
        self.acc = [[np.zeros_like(x) for x in start] for _ in range(world)]
        self.v = [np.zeros_like(x) for x in start]
        self.anchor = [np.zeros_like(x) for x in start]
        self.masks = [None] * len(params)
        self.cars = [CarReference(x.size, world) for x in start] if world > 1 else None
        self.updates = 0
        self.frozen = False
        self.var_interval, self.var_counter = 1, 0
        self.local_interval, self.local_counter = 1, 0
        self.variance_updates = 0
        self.reset_interval()

    # -- public --------------------------------------------------------------
    def params(self, rank=0):
        return [_to_param_dtype(x, k) for x, k in zip(self.master[rank], self.kinds)]

    def set_mask(self, index, mask):
        self.masks[index] = None if mask is None else f32(mask).ravel().copy()

    def reset_interval(self):
        self.lrs = [0.0] * len(self.groups)
        self.decay = [1.0] * len(self.groups)

    def averaged_next(self):
        return not self.frozen and (self.updates + 2) % self.var_interval == 0

    def step(self, grads_per_rank):
        P = self.world
        count = len(self.v)
        local = [[f32(g).ravel() for g in grads] for grads in grads_per_rank]
        full = self.averaged_next()
        if any(not np.all(np.isfinite(g)) for grads in local for g in grads):
            return dict(skipped=True, phase=SKIPPED, step=self.updates, grad_norm=-1.0, would_be_full=full)
        k = self.updates + 2
        inv = F32(1.0) / F32(P)
        averaged = None
        if full and P > 1:
            averaged = []
            for i in range(count):
                total = local[0][i].copy()
                for r in range(1, P):
                    total = (total + local[r][i]).astype(np.float32)
                averaged.append((total * inv).astype(np.float32))
        norm, coef = -1.0, 1.0
        if self.clip > 0.0 or self.report_norm:
            if averaged is not None:
                sumsq = sum_squares(np.concatenate(averaged))
            elif P > 1:
                sumsq = sum(sum(sum_squares(g) for g in local[r]) for r in range(P)) / P
            else:
                sumsq = sum(sum_squares(g) for g in local[0])
            norm = float(np.sqrt(sumsq)) / self.loss_scale
            if self.clip > 0.0:
                coef = min(1.0, self.clip / (norm + 1e-6))
        mul = F32(coef / self.loss_scale)
        if averaged is None and full:
            averaged = local[0]
        if not self.frozen:
            phase = self._variance_step(local, averaged, mul, k)
        else:
            phase = self._local_step(local, mul, k)
        self.updates += 1
        return dict(skipped=False, phase=phase, step=self.updates, grad_norm=norm, would_be_full=full)

    # -- phases --------------------------------------------------------------
    def _consts(self, i):
        """Constants of this update (t = updates + 1) with v's variance_updates."""
        g = self.groups[self.group_of[i]]
        beta1, beta2 = F32(g.beta1), F32(g.beta2)
        c = dict(beta1=beta1, beta2=beta2, omb1=F32(F32(1.0) - beta1), omb2=F32(F32(1.0) - beta2),
                 eps=F32(g.eps), wd=F32(g.weight_decay), step_size=F32(-F32(g.lr)))
        c.update(bias_consts(beta1, beta2, self.updates + 1, self.variance_updates, self.bias_correction))
        return c

    def _lr_weight(self, group):
        """What a local step adds to the interval's lr sum: lr times the
        momentum's bias correction, in double (src/algorithms/onebit/zero_one_adam.cpp)."""
        if not self.bias_correction:
            return group.lr
        return group.lr * (1.0 / (1.0 - float(F32(group.beta1)) ** float(self.updates + 1)))

    def limit(self, i):
        """L = float(limit / sqrt(1 - beta2^K)), K the variance updates so far."""
        if not self.stabilize:
            return None
        b2t = float(self.groups[self.group_of[i]].beta2) ** float(max(self.variance_updates, 1))
        return F32(self.stabilize_limit / np.sqrt(1.0 - b2t))

    @staticmethod
    def _direction(m, v, c, limit):
        m = (m * c["scale"]).astype(np.float32)
        if limit is not None:
            m = clamp(m, v, limit)
        return (m / denominator(v, c)).astype(np.float32)

    @staticmethod
    def _with_decay(q, p, c):
        return fma32(c["wd"], p, q) if c["wd"] > 0 else q

    def _momentum(self, m, g, c):
        return fma32(g, c["omb1"], (m * c["beta1"]).astype(np.float32))

    def _variance_step(self, local, averaged, mul, k):
        P = self.world
        count = len(self.v)
        if k % self.var_interval == 0:
            # after a 1-bit step m may hold +-scale where v ~ 0: clamp (K after this update)
            compressed_before = self.variance_updates < self.updates
            self.variance_updates += 1
            for i in range(count):
                c = self._consts(i)
                g = (averaged[i] * mul).astype(np.float32)
                m = self._momentum(self.m[0][i], g, c)
                self.v[i] = fma32((g * g).astype(np.float32), c["omb2"], (self.v[i] * c["beta2"]).astype(np.float32))
                p = self.master[0][i]
                limit = self.limit(i) if compressed_before else None
                p = fma32(c["step_size"], self._with_decay(self._direction(m, self.v[i], c, limit), p, c), p)
                for r in range(P):
                    self.m[r][i], self.master[r][i] = m.copy(), p.copy()
            self.var_counter += 1
            if self.var_counter == self.var_update_scaler:
                self.var_counter = 0
                self.var_interval *= 2
            phase = FULL
        else:
            for i in range(count):
                c = self._consts(i)
                gs = [(local[r][i] * mul).astype(np.float32) for r in range(P)]
                if P > 1 and self.update_units:
                    g = self.cars[i].run([to_update_units(x, self.v[i], c, self.limit(i)) for x in gs])[0]
                    g = (g * denominator(self.v[i], c)).astype(np.float32)
                else:
                    g = self.cars[i].run(gs)[0] if P > 1 else gs[0]
                if self.masks[i] is not None:
                    g = (g * self.masks[i]).astype(np.float32)
                m = self._momentum(self.m[0][i], g, c)
                p = self.master[0][i]
                p = fma32(c["step_size"], self._with_decay(self._direction(m, self.v[i], c, self.limit(i)), p, c), p)
                for r in range(P):
                    self.m[r][i], self.master[r][i] = m.copy(), p.copy()
            phase = COMPRESSED
        if k > self.var_freeze_step:
            self.frozen = True
            if self.cars:
                for car in self.cars:
                    car.reset()
            for r in range(P):
                self.acc[r] = [np.zeros_like(x) for x in self.v]
            self.anchor = [x.copy() for x in self.master[0]]
            self.reset_interval()
        return phase

    def _local_step(self, local, mul, k):
        P = self.world
        for g, group in enumerate(self.groups):
            self.lrs[g] += self._lr_weight(group)
            self.decay[g] *= 1.0 - group.lr * group.weight_decay
        for i in range(len(self.v)):
            c = self._consts(i)
            for r in range(P):
                g = (local[r][i] * mul).astype(np.float32)
                m = self._momentum(self.m[r][i], g, c)
                p = self.master[r][i]
                q = self._direction(m, self.v[i], c, self.limit(i))
                u = self._with_decay(q, p, c)
                self.acc[r][i] = fma32(c["step_size"], q if self.decoupled else u, self.acc[r][i])
                self.master[r][i] = fma32(c["step_size"], u, p)
                self.m[r][i] = m
        sync = k % self.local_interval == 0
        if sync:
            self._sync()
        self.local_counter += 1
        if self.local_counter == self.local_step_scaler:
            self.local_counter = 0
            self.local_interval = min(self.local_step_clipper, 2 * self.local_interval)
        return SYNC if sync else LOCAL

    def _sync(self):
        P = self.world
        for i in range(len(self.v)):
            c = self._consts(i)
            gi = self.group_of[i]
            d = denominator(self.v[i], c)
            if P > 1 and self.update_units:
                a = (self.cars[i].run([self.acc[r][i] for r in range(P)])[0] * d).astype(np.float32)
            else:
                xs = [(self.acc[r][i] * d).astype(np.float32) for r in range(P)]
                a = self.cars[i].run(xs)[0] if P > 1 else xs[0]
            if self.masks[i] is not None:
                a = (a * self.masks[i]).astype(np.float32)
            lrs = F32(self.lrs[gi])
            # lr 0 over the interval: every rank keeps its m (DeepSpeed's 0 / 0 is NaN)
            m = ((a / lrs).astype(np.float32) * F32(-1.0)).astype(np.float32) if lrs != 0 else None
            limit = self.limit(i)
            if limit is not None:
                a = clamp(a, self.v[i], F32(limit * lrs))
            anchor = self.anchor[i]
            if self.decoupled:
                anchor = (anchor * F32(self.decay[gi])).astype(np.float32)
            p = (anchor + (a / d).astype(np.float32)).astype(np.float32)
            self.anchor[i] = p.copy()
            for r in range(P):
                self.master[r][i] = p.copy()
                if m is not None:
                    self.m[r][i] = m.copy()
                self.acc[r][i] = np.zeros_like(p)
        self.reset_interval()

    # -- the K2 rule (another world size) -------------------------------------
    def restart_at(self, world, rank_blob=0):
        """Continue at `world` ranks from rank `rank_blob`'s state as a blob
        restores it there: m, v, schedules and parameters kept; errors,
        accumulator and the interval's lr sums reset; the parameters of the
        last sync become the loaded parameters."""
        out = ZeroOneAdamReference.__new__(ZeroOneAdamReference)
        out.__dict__.update({k: v for k, v in self.__dict__.items()})
        out.world = world
        src_m, src_p = self.m[rank_blob], self.master[rank_blob]
        out.master = [[x.copy() for x in src_p] for _ in range(world)]
        out.m = [[x.copy() for x in src_m] for _ in range(world)]
        out.acc = [[np.zeros_like(x) for x in src_p] for _ in range(world)]
        out.v = [x.copy() for x in self.v]
        out.anchor = [x.copy() for x in src_p]
        out.cars = [CarReference(x.size, world) for x in self.v] if world > 1 else None
        out.reset_interval()
        return out
