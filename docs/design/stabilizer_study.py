"""The study behind dsopt's stabilized 1-bit compression stage
(stable-1bit.md): candidate rules for the update after the momentum has
gone through the 1-bit compressed allreduce, simulated in plain numpy
(P ranks in one process, DeepSpeed's padding and error feedback, float32;
not bit-exact with dsopt) on the digits MLP of
examples/python/small_models.py: 300 steps, global batch 64, weight decay
0.01, betas (0.9, 0.999), eps 1e-8.

    python3 docs/design/stabilizer_study.py      # about 6 minutes on 2 cores

Prints, per learning rate, freeze_step and world size, the median over 3
seeds of the final training loss of each rule, with the worst seed's ratio to
the same rule without compression (freeze after the run) in brackets.
"""
import os
import sys
from math import gcd

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
from small_models import MLP, load_digits_split  # noqa: E402

BETA1, BETA2, EPS, WD = 0.9, 0.999, 1e-8, 0.01


def padded_length(n, world):
    unit = world * (8 * world // gcd(world, 8))
    return n if n % unit == 0 else n + unit - n % unit


class CompressedAllreduce:
    """One tensor's 1-bit allreduce with worker and server error feedback."""

    def __init__(self, n, world):
        self.n, self.world = n, world
        self.padded = padded_length(n, world)
        self.chunk = self.padded // world
        self.worker_error = np.zeros((world, self.padded), np.float32)
        self.server_error = np.zeros((world, self.chunk), np.float32)

    def run(self, per_rank):
        P, n, c = self.world, self.n, self.chunk
        y = self.worker_error.copy()
        y[:, :n] += per_rank
        scale = np.sqrt((y.astype(np.float64) ** 2).sum(1)) / np.sqrt(self.padded)
        sign = np.where(y < 0, -1.0, 1.0).astype(np.float32)
        self.worker_error = (y - scale[:, None] * sign).astype(np.float32)
        z = (sign * (scale[:, None] / P)).reshape(P, P, c).sum(0) + self.server_error
        server_scale = np.sqrt((z.astype(np.float64) ** 2).sum(1)) / np.sqrt(c)
        server_sign = np.where(z < 0, -1.0, 1.0)
        self.server_error = (z - server_scale[:, None] * server_sign).astype(np.float32)
        return (server_sign * server_scale[:, None]).reshape(-1)[:n].astype(np.float32)


def denominator_and_momentum(rule, m, v, frozen_after):
    """The rule under study: (denominator, momentum used) of one tensor's
    compression-stage update u = momentum / denominator."""
    root = np.sqrt(v)
    if rule == "deepspeed":
        return root + EPS, m
    if rule == "floor_0.1_mean":       # the lead: floor at 0.1 x the tensor's mean
        d = root + EPS
        return np.maximum(d, 0.1 * d.mean()), m
    if rule == "bias_corrected_v":     # v / (1 - beta2^K), else DeepSpeed's
        return root / np.sqrt(1 - BETA2 ** frozen_after) + EPS, m
    limit = 1.0 / np.sqrt(1 - BETA2 ** frozen_after)
    if rule == "clip_update":          # |u| <= 1/sqrt(1 - beta2^K)
        d = root + EPS
        return d, np.clip(m, -limit * d, limit * d)
    if rule.startswith("clamp_momentum"):  # dsopt: |m| <= c sqrt(v / (1 - beta2^K))
        c = float(rule.split("_")[-1])
        return root + EPS, np.clip(m, -c * limit * root, c * limit * root)
    raise ValueError(rule)


def run(rule, world, freeze_step, lr, seed, steps=300, batch=64):
    model, data = MLP(), load_digits_split()
    params = model.init_params(seed)
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    draw = np.random.RandomState(seed + 1000)
    cars, frozen_after, local = None, 0, batch // world
    for k in range(1, steps + 1):  # k: DeepSpeed's counter, updates + 1
        idx = draw.choice(len(data.y_train), batch, replace=False)
        grads = [model.loss_and_grads(params, data.x_train[idx[r * local:(r + 1) * local]],
                                      data.y_train[idx[r * local:(r + 1) * local]])[1] for r in range(world)]
        if not all(np.all(np.isfinite(g)) for gs in grads for g in gs):
            continue  # skipped on every rank
        if k < freeze_step or freeze_step <= 1 and k == 1:
            for i in range(len(params)):
                g = np.mean([gs[i] for gs in grads], 0).astype(np.float32)
                m[i] = BETA1 * m[i] + (1 - BETA1) * g
                v[i] = BETA2 * v[i] + (1 - BETA2) * g * g
                params[i] = params[i] - lr * (m[i] / (np.sqrt(v[i]) + EPS) + WD * params[i])
            frozen_after = k
            continue
        if cars is None:
            cars = [CompressedAllreduce(p.size, world) for p in params]
        for i in range(len(params)):
            per_rank = np.stack([BETA1 * m[i].ravel() + (1 - BETA1) * gs[i].ravel() for gs in grads])
            m[i] = (cars[i].run(per_rank) if world > 1 else per_rank[0]).reshape(params[i].shape)
            d, used = denominator_and_momentum(rule, m[i], v[i], frozen_after)
            params[i] = params[i] - lr * (used / d + WD * params[i])
    return model.evaluate(params, data.x_train, data.y_train)[0]


RULES = ["deepspeed", "floor_0.1_mean", "bias_corrected_v", "clip_update", "clamp_momentum_1",
         "clamp_momentum_2"]

if __name__ == "__main__":
    seeds = range(3)
    print("| P | lr | freeze | no compression | " + " | ".join(RULES) + " |")
    print("|" + " --- |" * (4 + len(RULES)))
    for world in (4, 1):
        for lr in (1e-3, 1e-2):
            for freeze in (15, 45, 150):
                with np.errstate(all="ignore"):
                    base = [run("deepspeed", world, 10 ** 9, lr, s) for s in seeds]
                    cells = []
                    for rule in RULES:
                        losses = [run(rule, world, freeze, lr, s) for s in seeds]
                        worst = max(l / b for l, b in zip(losses, base))
                        median = np.median(losses)
                        cells.append("NaN" if not np.isfinite(median) else
                                     f"{median:.3f} ({worst:.1f}x)" if np.isfinite(worst) else
                                     f"{median:.3f} (NaN)")
                print(f"| {world} | {lr:g} | {freeze} | {np.median(base):.3f} | " + " | ".join(cells) + " |",
                      flush=True)
