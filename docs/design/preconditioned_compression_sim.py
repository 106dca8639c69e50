"""A candidate rule for 1-bit Adam and 0/1 Adam, simulated: compress the
momentum (1-bit Adam), the gradient (0/1 Adam's 1-bit steps) and the
accumulator (0/1 Adam's syncs) divided by Adam's denominator
d = sqrt(v) c2 + eps, and multiply the decompressed result by d again
("preconditioned compression"), instead of compressing them as they are.

Why: a compressed tensor gets one scale per chunk, the RMS of its
elements, so every element comes back as +-that scale. Where the
elements' v differ by orders of magnitude inside one tensor (the query and
key thirds of a fused QKV projection, whose gradients are tiny while
attention is still uniform; the embedding and output rows of rare bytes),
the small-v elements get updates of tens of times AdamW's, which the
stabilized rule clamps to stabilize_limit sqrt(v). Error feedback keeps the
mean of the decompressed values right, but the clamp cuts it: those
elements stop learning. Divided by d, every element of a tensor is in the
units of the update, where one scale fits them all; v is frozen and the
same on every rank, so the division is exact and costs nothing on the wire.

The simulation runs the numpy references of tests/python
(onebit_reference.py, zoadam_reference.py: the library's rules, fp32
operation for operation) on P simulated ranks in one process, with the GPT
of examples/python/gpt.py and transformer_runs' user settings; "as is"
reproduces the library's runs (the final validation loss is printed next
to them), "preconditioned" wraps each tensor's compressed allreduce.

    python3 docs/design/preconditioned_compression_sim.py [--seeds 0]
        [--models tiny:licenses] [--optimizers OneBitAdam,ZeroOneAdam]
        [--options JSON] [--out results.json]

--options: config keys over the user settings for both arms (e.g.
'{"stabilize_limit": 4.0}'), named in the results.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import gpt  # noqa: E402
import transformer_runs  # noqa: E402
from onebit_reference import OneBitAdamReference, denominator  # noqa: E402
from zoadam_reference import ZeroOneAdamReference  # noqa: E402

REFERENCES = {"OneBitAdam": OneBitAdamReference, "ZeroOneAdam": ZeroOneAdamReference}


class PreconditionedCar:
    """A tensor's compressed allreduce that compresses x / d and returns
    the result times d, d the tensor's current Adam denominator."""

    def __init__(self, car, denominator_of):
        self.car, self.denominator_of = car, denominator_of

    def run(self, xs):
        d = self.denominator_of()
        out, wire = self.car.run([(x / d).astype(np.float32) for x in xs])
        return (out * d).astype(np.float32), wire

    def reset(self):
        self.car.reset()


def precondition(ref):
    """Wraps every compressed allreduce of a OneBitAdamReference or
    ZeroOneAdamReference (made now, or, for 1-bit Adam, at the freeze)."""
    def denominator_of(i):
        return lambda: denominator(ref.v[i], ref._consts(i, ref.updates + 1, ref.frozen_after)
                                   if isinstance(ref, OneBitAdamReference) else ref._consts(i))

    if isinstance(ref, ZeroOneAdamReference):
        ref.cars = [PreconditionedCar(car, denominator_of(i)) for i, car in enumerate(ref.cars)]
        return ref
    step = ref.step

    def wrapped_step(grads_per_rank):
        if ref.compression and ref.cars is None:
            from onebit_reference import CarReference
            ref.cars = {i: PreconditionedCar(CarReference(ref.master[i].size, ref.world), denominator_of(i))
                        for i in ref.compressed_indices()}
        return step(grads_per_rank)
    ref.step = wrapped_step
    return ref


def rank_params(ref, rank):
    return ref.params(rank) if isinstance(ref, ZeroOneAdamReference) else ref.params()


def simulate(run, world, preconditioned):
    """(validation curve of rank 0, final validation loss of rank 0)."""
    torch.set_num_threads(1)
    config = gpt.CONFIGS[run.size]
    corpus = gpt.load_corpus(run.corpus)
    model = gpt.build_model(config, run.seed)
    tensors = list(model.parameters())
    kwargs = transformer_runs.optimizer_kwargs(run)
    params = {k: v for k, v in kwargs.items() if k not in ("threads", "gradient_clipping")}
    ref = REFERENCES[run.optimizer]({"optimizer": {"type": run.optimizer, "params": params}},
                                    [p.detach().numpy().ravel().copy() for p in tensors], world)
    if preconditioned:
        ref = precondition(ref)
    factor = gpt.warmup_cosine(run.steps)
    local = run.batch // world

    def load(rank):
        with torch.no_grad():
            for p, value in zip(tensors, rank_params(ref, rank)):
                p.copy_(torch.from_numpy(value.reshape(p.shape)))

    curve = [[0, gpt.validation_loss(model, corpus, config.context)]]
    for step in range(run.steps):
        for group in ref.groups:
            group.lr = kwargs["lr"] * factor(step)
        x, y = gpt.train_batch(corpus, step, run.batch, config.context, run.seed)
        grads = []
        for rank in range(world):
            load(rank)
            model.zero_grad(set_to_none=True)
            model.loss(x[rank * local:(rank + 1) * local], y[rank * local:(rank + 1) * local]).backward()
            grads.append([p.grad.detach().numpy().ravel().copy() for p in tensors])
        ref.step(grads)
        if (step + 1) % run.eval_every == 0:
            load(0)
            curve.append([step + 1, gpt.validation_loss(model, corpus, config.context)])
    load(0)
    return curve, gpt.validation_loss(model, corpus, config.context)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--models", default="tiny:licenses")
    parser.add_argument("--optimizers", default="OneBitAdam,ZeroOneAdam")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--out", default="preconditioned_compression_sim.json")
    args = parser.parse_args()
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {}
    options = json.loads(args.options)
    suffix = "".join(f" {k}={v}" for k, v in options.items())
    for model_corpus in args.models.split(","):
        model, corpus = model_corpus.split(":")
        for seed in map(int, args.seeds.split(",")):
            for optimizer in args.optimizers.split(","):
                for preconditioned in (False, True):
                    arm = "preconditioned" if preconditioned else "as is"
                    name = f"{model}/{corpus}/{seed}/{optimizer}/{arm}{suffix}"
                    if name in results:
                        continue
                    run = transformer_runs.TransformerRun(name, optimizer, size=model, corpus=corpus,
                                                          steps=args.steps, seed=seed, options=options)
                    start = time.perf_counter()
                    curve, final = simulate(run, args.world, preconditioned)
                    results[name] = {"validation": curve, "final_validation": final}
                    out.write_text(json.dumps(results))
                    print(f"{name}: final validation {final:.4f} ({time.perf_counter() - start:.0f} s)", flush=True)
    for name, r in results.items():
        print(f"| {name} | {r['final_validation']:.4f} | "
              f"{' '.join(f'{v:.3f}' for _, v in r['validation'][::2])} |")
    finals = {}
    for name, r in results.items():
        finals.setdefault(name.split("/", 3)[3], []).append(r["final_validation"])
    for key, values in finals.items():
        print(f"{key}: mean final validation {statistics.mean(values):.4f} over {len(values)}")


if __name__ == "__main__":
    main()
