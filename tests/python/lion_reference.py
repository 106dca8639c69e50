"""Float64 reference of dsopt's Lion step (docs/optimizers/lion.md): the
constants in fp32 as the library forms them (lr, betas, weight_decay
rounded to fp32, -lr * wd one fp32 product); p in float64. The moment m
and the interpolation c are formed as in fp32 (a product, then a fused
multiply-add, rounded once), so that sign(c) is decided exactly as the
contract says where c is within rounding of zero; the parameter update
itself runs in float64."""

import numpy as np


def f32(x):
    return np.float32(x)


def fma32(a, b, c):
    """fl32(a * b + c) for fp32 a, b, c: the product is exact in float64."""
    return (a.astype(np.float64) * np.float64(b) + c.astype(np.float64)).astype(np.float32)


class LionReference:
    """``groups``: dicts with lr, betas, weight_decay; ``group_of``: group per parameter."""

    def __init__(self, params, groups, group_of=None):
        self.p = [np.asarray(x, dtype=np.float64).ravel().copy() for x in params]
        self.m = [np.zeros(x.size, np.float32) for x in self.p]
        self.groups = [dict(g) for g in groups]
        self.group_of = list(group_of) if group_of is not None else [0] * len(self.p)

    def step(self, grads, skip=()):
        for i, g in enumerate(grads):
            if i in skip:
                continue
            h = self.groups[self.group_of[i]]
            b1, b2 = f32(h["betas"][0]), f32(h["betas"][1])
            lr, wd = f32(h["lr"]), f32(h["weight_decay"])
            g = np.asarray(g, np.float32).ravel()
            m = self.m[i]
            c = fma32(g, f32(1) - b1, m * b1)
            decay = float(f32(-lr * wd))  # one fp32 product, as the library forms it
            self.p[i] = self.p[i] + self.p[i] * decay - float(lr) * np.sign(c).astype(np.float64)
            self.m[i] = fma32(g, f32(1) - b2, m * b2)


def lion_groups(config):
    """The groups of a Lion config: optimizer.params over the paper's
    defaults, each param_groups entry over them."""
    base = {"lr": 1e-4, "betas": [0.9, 0.99], "weight_decay": 0.0}
    base.update(config["optimizer"].get("params", {}))
    return [dict(base, **g) for g in config.get("param_groups", [{}])]
