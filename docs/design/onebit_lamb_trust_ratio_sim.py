"""1-bit LAMB's compression stage, simulated: which momentum units and which
trust ratio let it train like LAMB on the small GPTs and the MLPs.

Runs the numpy reference of tests/python/onebit_lamb_reference.py (the
library's rule, fp32 operation for operation) on P simulated ranks, with
the user settings of examples/python/transformer_runs.py (GPTs: lr 1e-2,
weight_decay 0.01, freeze_step 15% of 300 steps, warmup then cosine) or of
tests/python/test_real_models.py (digits MLP, bytes model: lr 1e-2,
weight_decay 0.01, freeze_step 45, global batch 64, 300 steps). Variants of
the compression stage (the reference's `update_units` and `trust_ratio`):

    frozen        momenta rescaled per tensor around the compressed
                  allreduce, step coefficient = frozen coefficient x factor
                  (DeepSpeed's rule with the stabilized clamp)
    units         momenta in the update's units (clamp(m) / d), frozen
                  coefficient x factor
    units_live    update's units, LAMB's trust ratio ||p|| / ||u|| alone
    units_larger  update's units, the larger of the two (the library's rule)
    lamb          no freeze: LAMB without compression (the baseline)

Prints the final loss (validation loss for the GPTs, training loss for the
MLPs) per model, seed and variant.

    python3 docs/design/onebit_lamb_trust_ratio_sim.py [--models tiny:licenses,digits]
        [--seeds 0] [--variants frozen,units,units_live,units_larger,lamb] [--world 4]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
for sub in ("docs/design", "examples/python", "tests/python"):
    sys.path.insert(0, str(REPO / sub))
from onebit_lamb_reference import OneBitLambReference  # noqa: E402

VARIANTS = {"frozen": (False, "frozen"), "units": (True, "frozen"), "units_live": (True, "live"),
            "units_larger": (True, "larger"), "lamb": (True, "larger")}
STEPS, FREEZE = 300, 45


def reference_factory(variant):
    units, trust_ratio = VARIANTS[variant]

    def make(config, params, world, **kwargs):
        ref = OneBitLambReference(config, params, world, **kwargs)
        ref.update_units, ref.trust_ratio = units, trust_ratio
        return ref
    return make


def run_gpt(size, corpus, seed, variant, world):
    import preconditioned_compression_sim as sim
    import transformer_runs

    sim.REFERENCES["OneBitLamb"] = reference_factory(variant)
    options = {"freeze_step": STEPS + 1} if variant == "lamb" else {}
    run = transformer_runs.TransformerRun(variant, "OneBitLamb", size=size, corpus=corpus, steps=STEPS,
                                          seed=seed, options=options)
    _, final = sim.simulate(run, world, False)
    return final


def run_mlp(name, seed, variant, world, batch=64):
    from training_runs import MODELS

    cls, loader = MODELS[name]
    model, data = cls(), loader()
    params = model.init_params(seed)
    shapes = [p.shape for p in params]
    freeze = STEPS + 1 if variant == "lamb" else FREEZE
    config = {"optimizer": {"type": "OneBitLamb",
                            "params": {"lr": 1e-2, "weight_decay": 0.01, "freeze_step": freeze}}}
    ref = reference_factory(variant)(config, [p.ravel().copy() for p in params], world)
    draw = np.random.RandomState(seed + 1000)  # training_runs.train's batches
    local = batch // world
    for _ in range(STEPS):
        idx = draw.choice(len(data.y_train), batch, replace=False)
        current = [x.reshape(s) for x, s in zip(ref.params(), shapes)]
        grads = []
        for r in range(world):
            part = idx[r * local:(r + 1) * local]
            _, g = model.loss_and_grads(current, data.x_train[part], data.y_train[part])
            grads.append([x.ravel().astype(np.float32) for x in g])
        ref.step(grads)
    current = [x.reshape(s) for x, s in zip(ref.params(), shapes)]
    return model.evaluate(current, data.x_train, data.y_train)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny:licenses,small:python,digits,chars")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--world", type=int, default=4)
    args = parser.parse_args()
    for model in args.models.split(","):
        for seed in map(int, args.seeds.split(",")):
            for variant in args.variants.split(","):
                if ":" in model:
                    final = run_gpt(*model.split(":"), seed, variant, args.world)
                else:
                    final = run_mlp(model, seed, variant, args.world)
                print(f"{model} seed {seed} {variant}: {final:.4f}", flush=True)


if __name__ == "__main__":
    main()
