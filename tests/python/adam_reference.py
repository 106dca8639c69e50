"""Float64 reference of one dsopt Adam/AdamW step, from docs/optimizers/adam.md
("What one step computes"). Scalar constants are formed as the contract
says (fp32 hyperparameters, beta^t = float(pow(double(beta), t))); the
element math runs in float64 on a float64 master copy."""

from dataclasses import dataclass

import numpy as np


def f32(x) -> float:
    return float(np.float32(x))


@dataclass
class Hyper:
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0


class AdamReference:
    """``groups``: list of Hyper; ``group_of``: group index per parameter."""

    def __init__(self, params, groups, group_of=None, *, decoupled=True, bias_correction=True):
        self.p = [np.asarray(x, dtype=np.float64).ravel().copy() for x in params]
        self.m = [np.zeros_like(x) for x in self.p]
        self.v = [np.zeros_like(x) for x in self.p]
        self.groups = [Hyper(**vars(g)) for g in groups]
        self.group_of = list(group_of) if group_of is not None else [0] * len(self.p)
        self.t = [0] * len(self.groups)
        self.decoupled = decoupled
        self.bias_correction = bias_correction

    def set_lr(self, lr, group=None):
        for i, g in enumerate(self.groups):
            if group is None or group == i:
                g.lr = lr

    def _constants(self, group):
        h = self.groups[group]
        t = self.t[group]
        beta1, beta2, lr, wd = f32(h.beta1), f32(h.beta2), f32(h.lr), f32(h.weight_decay)
        if self.bias_correction:
            bc1 = f32(1.0 - f32(beta1 ** t))
            rbc2 = f32(1.0 / np.sqrt(f32(1.0 - f32(beta2 ** t))))
        else:
            bc1, rbc2 = 1.0, 1.0
        return dict(
            beta1=beta1, beta2=beta2, one_m_b1=f32(1.0 - beta1), one_m_b2=f32(1.0 - beta2),
            eps=f32(h.eps), wd=wd, rbc2=rbc2, step_size=f32(-lr / bc1), wdecay=f32(-lr * wd),
        )

    def step(self, grads, mul=1.0):
        """Applies one update; ``grads`` are the (averaged) gradients as
        given to the optimizer, ``mul`` the gradient multiplier coef/S."""
        mul = f32(mul)
        for group in range(len(self.groups)):
            if group in self.group_of:
                self.t[group] += 1
        consts = [self._constants(g) if g in self.group_of else None for g in range(len(self.groups))]
        for i, grad in enumerate(grads):
            c = consts[self.group_of[i]]
            g = np.asarray(grad, dtype=np.float64).ravel() * mul
            p, m, v = self.p[i], self.m[i], self.v[i]
            if not self.decoupled:
                g = p * c["wd"] + g
            m *= c["beta1"]
            m += g * c["one_m_b1"]
            v *= c["beta2"]
            v += g * g * c["one_m_b2"]
            q = m / (np.sqrt(v) * c["rbc2"] + c["eps"])
            if self.decoupled:
                p += p * c["wdecay"]
            p += q * c["step_size"]


def global_norm(grads) -> float:
    """sqrt(sum g^2) of fp32 gradients, in float64."""
    return float(np.sqrt(sum(np.sum(np.asarray(g, dtype=np.float64) ** 2) for g in grads)))


def clip_multiplier(grads, clip, scale=1.0):
    """(norm of the unscaled gradient, multiplier coef/S) per the contract."""
    norm = global_norm(grads) / scale
    coef = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    return norm, f32(coef / scale)


class LossScalerReference:
    """The dynamic loss scaler of docs/optimizers/adam.md; static when ``static_scale > 0``."""

    def __init__(self, initial_scale_power=16, window=1000, hysteresis=2,
                 consecutive_hysteresis=False, min_scale=1.0, static_scale=0.0):
        self.static = static_scale > 0
        self.scale = float(static_scale) if self.static else 2.0 ** initial_scale_power
        self.window = window
        self.hysteresis = hysteresis
        self.consecutive = consecutive_hysteresis
        self.min_scale = min_scale
        self.iter = 0
        self.last_overflow = -1
        self.hyst = hysteresis

    def update(self, overflow: bool) -> float:
        if self.static:
            return self.scale
        if overflow:
            if self.hysteresis == 1 or self.hyst == 1:
                self.scale = max(self.scale / 2, self.min_scale)
            else:
                self.hyst -= 1
            self.last_overflow = self.iter
        else:
            if self.consecutive:
                self.hyst = self.hysteresis
            if (self.iter - self.last_overflow) % self.window == 0:
                if not self.consecutive:
                    self.hyst = self.hysteresis
                self.scale *= 2
        self.iter += 1
        return self.scale
