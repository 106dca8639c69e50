"""Where 0/1 Adam's stabilizing clamp must act (docs/design/stable-1bit.md,
"0/1 Adam"): the digits MLP of examples/python/small_models.py trained with
the bit-exact numpy reference of tests/python/zoadam_reference.py on P
simulated ranks, with the clamp on the momentum of 1-bit and local steps
("steps"), on the sync's parameter correction ("sync"), both (dsopt's rule)
or neither (DeepSpeed's rule). Prints the final training loss of rank 0's
parameters (NaN: diverged), per seed.

    python3 docs/design/zoadam_clamp_study.py [--world 4] [--steps 300] [--seeds 0 1 2]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "python"), str(ROOT / "examples" / "python")]

import small_models  # noqa: E402
from zoadam_reference import ZeroOneAdamReference  # noqa: E402


class Variant(ZeroOneAdamReference):
    """The reference with the clamp switched per place."""

    def __init__(self, *args, clamp_steps=True, clamp_sync=True, **kw):
        super().__init__(*args, **kw)
        self.clamp_steps, self.clamp_sync = clamp_steps, clamp_sync
        self._on = clamp_steps

    def limit(self, i):
        return super().limit(i) if self._on else None

    def _sync(self):
        self._on = self.clamp_sync
        try:
            super()._sync()
        finally:
            self._on = self.clamp_steps


VARIANTS = {
    "deepspeed": dict(stabilize=False),
    "steps only": dict(clamp_steps=True, clamp_sync=False),
    "sync only": dict(clamp_steps=False, clamp_sync=True),
    "both (dsopt)": dict(clamp_steps=True, clamp_sync=True),
}


def run(variant, world, steps, seed, var_freeze_step, lr, decoupled=False, local_step_scaler=10):
    model, data = small_models.MLP(), small_models.load_digits_split()
    params = model.init_params(seed)
    shapes = [p.shape for p in params]
    opts = dict(VARIANTS[variant])
    stabilize = opts.pop("stabilize", True)
    config = {"optimizer": {"type": "ZeroOneAdam", "params": {
        "lr": lr, "weight_decay": 0.01, "var_freeze_step": var_freeze_step, "var_update_scaler": 16,
        "local_step_scaler": local_step_scaler, "local_step_clipper": 16, "stabilize": stabilize,
        "decoupled_sync_weight_decay": decoupled}}}
    ref = Variant(config, params, world, **opts) if opts else ZeroOneAdamReference(config, params, world)
    draw = np.random.RandomState(seed + 1000)
    local = 64 // world
    with np.errstate(all="ignore"):
        for _ in range(steps):
            idx = draw.choice(len(data.y_train), 64, replace=False)
            grads = []
            for r in range(world):
                p = [x.reshape(s) for x, s in zip(ref.master[r], shapes)]
                part = idx[r * local:(r + 1) * local]
                grads.append([g.ravel() for g in model.loss_and_grads(p, data.x_train[part], data.y_train[part])[1]])
            info = ref.step(grads)
            if info["skipped"]:
                return float("nan")
        p = [x.reshape(s) for x, s in zip(ref.master[0], shapes)]
        return model.evaluate(p, data.x_train, data.y_train)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--var-freeze-step", type=int, default=45)
    ap.add_argument("--local-step-scaler", type=int, default=10)
    ap.add_argument("--decoupled", action="store_true", help="decoupled_sync_weight_decay")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    a = ap.parse_args()
    print(f"P={a.world}, lr {a.lr}, var_freeze_step {a.var_freeze_step}, local_step_scaler {a.local_step_scaler},"
          f" decoupled_sync_weight_decay {a.decoupled}, {a.steps} steps; final train loss per seed")
    for v in a.variants:
        losses = [run(v, a.world, a.steps, s, a.var_freeze_step, a.lr, a.decoupled, a.local_step_scaler)
                  for s in a.seeds]
        print(f"| {v} | " + " | ".join(f"{x:.4f}" for x in losses) + " |", flush=True)


if __name__ == "__main__":
    main()
