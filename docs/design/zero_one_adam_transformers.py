"""0/1 Adam and 1-bit Adam on the GPT of examples/python/gpt.py: which
setting keeps them within 3% of AdamW. Each variant is the user settings of
examples/python/transformer_runs.py with some config keys changed; every
run is at 4 ranks, and the same seeds' AdamW runs are the baseline.

    python3 docs/design/zero_one_adam_transformers.py [--results FILE]
        [--models tiny:licenses] [--seeds 0] [--only NAME,NAME] [--plot DIR]

Prints, per model, the final validation loss of each variant relative to
AdamW (mean over the seeds) and the validation loss every 25 steps (mean
over the seeds); with --plot, one PNG of the curves per model (matplotlib).
Results accumulate in --results (transformer_study.py's format, so a study's
file can be shared: its AdamW runs are reused).
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import transformer_runs  # noqa: E402
import transformer_study  # noqa: E402


class FrozenVarianceRescale:
    """A candidate rule, emulated through the groups' settings: the frozen
    v of each tensor (``"per": "tensor"``) or of the whole model
    (``"global"``) is taken as scaled by how much the mean squared gradient
    has drifted since v's last update. Every rank tracks
    s = beta2 s + (1 - beta2) mean_ranks ||g_rank||^2 (per tensor or
    summed), bias-corrected; s at v's last update (the last full step) is
    the reference. On a step after the last full step the group's lr is
    divided by sqrt(s / reference) and its weight_decay multiplied by it
    (lr * weight_decay unchanged): the update m / sqrt(v * s / reference).
    In dsopt this would be a few scalars per step through the status
    allreduce; here mpi4py's allreduce carries them."""

    def __init__(self, comm, per="tensor", beta2=0.999):
        import dsopt

        self.comm, self.per, self.beta2 = comm, per, beta2
        self.full = dsopt.PHASE_FULL
        self.s = None
        self.t = 0
        self.reference = None

    def __call__(self, step, model, opt):
        params = [p for group in opt.param_groups for p in group["params"]]
        local = np.array([float(p.grad.detach().pow(2).sum()) if p.grad is not None else 0.0 for p in params])
        total = np.empty_like(local)
        self.comm.Allreduce(local, total)
        mean = total / self.comm.Get_size()
        if self.per == "global":
            mean = np.full_like(mean, mean.sum())
        self.s = (1 - self.beta2) * mean if self.s is None else self.beta2 * self.s + (1 - self.beta2) * mean
        self.t += 1
        s_hat = self.s / (1 - self.beta2 ** self.t)
        info = opt.last_step_info
        if info is None or info.phase == self.full:  # this step may be a full one: v is current
            self.reference = s_hat.copy()
            return
        ratio = np.where(self.reference > 0, s_hat / np.maximum(self.reference, 1e-30), 1.0)
        for group, r in zip(opt.param_groups, ratio):
            group["lr"] = group["lr"] / math.sqrt(r)
            group["weight_decay"] = transformer_runs.WEIGHT_DECAY * math.sqrt(r)


def make_hook(run, comm):
    return FrozenVarianceRescale(comm, **run.hook) if run.hook else None

# name -> (class, options over the user settings); None: after the run.
VARIANTS = {
    "zo_default": ("ZeroOneAdam", {}),
    "zo_no_bias_correction": ("ZeroOneAdam", {"bias_correction": False}),
    "zo_no_1bit_variance_phase": ("ZeroOneAdam", {"var_update_scaler": 100000}),
    "zo_stabilize_limit_16": ("ZeroOneAdam", {"stabilize_limit": 16.0}),
    "zo_no_stabilize": ("ZeroOneAdam", {"stabilize": False}),
    "zo_sync_intervals_to_16": ("ZeroOneAdam", {"local_step_scaler": 1, "local_step_clipper": 16}),
    "zo_decoupled_sync_decay": ("ZeroOneAdam", {"decoupled_sync_weight_decay": True}),
    "zo_var_freeze_50pct": ("ZeroOneAdam", {"var_freeze_step": 150}),
    "zo_var_never_frozen": ("ZeroOneAdam", {"var_freeze_step": None}),
    "ob_default": ("OneBitAdam", {}),
    "ob_no_bias_correction": ("OneBitAdam", {"bias_correction": False}),
    "ob_never_frozen": ("OneBitAdam", {"freeze_step": None}),
    "ob_freeze_50pct": ("OneBitAdam", {"freeze_step": 150}),
    "ob_no_stabilize": ("OneBitAdam", {"stabilize": False}),
    "ob_stabilize_limit_4": ("OneBitAdam", {"stabilize_limit": 4.0}),
    "ob_rescale_tensor": {"optimizer": "OneBitAdam", "tensor_groups": True, "hook": {"per": "tensor"}},
    "ob_rescale_global": {"optimizer": "OneBitAdam", "tensor_groups": True, "hook": {"per": "global"}},
    "zo_rescale_tensor": {"optimizer": "ZeroOneAdam", "tensor_groups": True, "hook": {"per": "tensor"}},
    "OneBitLamb_freeze_50pct": ("OneBitLamb", {"freeze_step": 150}),
    "OneBitLamb_factor_max_16": ("OneBitLamb", {"factor_max": 16.0}),
    "OneBitLamb_coeff_beta_0": ("OneBitLamb", {"coeff_beta": 0.0}),
    "OneBitLamb_no_stabilize": ("OneBitLamb", {"stabilize": False}),
    "adamw_lr2e-3": ("AdamW", {"lr": 2e-3}),
    "adamw_lr5e-4": ("AdamW", {"lr": 5e-4}),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="zero_one_adam_transformers.json")
    parser.add_argument("--models", default="tiny:licenses")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", default="")
    parser.add_argument("--plot", default="")
    args = parser.parse_args()
    models = [tuple(m.split(":")) for m in args.models.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.only.split(",") if args.only else list(VARIANTS)
    extra = {n: VARIANTS[n] for n in names}
    results = transformer_study.run_study(models, seeds, args.steps, 4, args.results, extra,
                                          base_runs=["AdamW"], worker_args=[Path(__file__).resolve(), "--worker"])
    print(transformer_study.table(results, models, seeds, ["AdamW", *names]))
    for model, corpus in models:
        print(f"\nValidation loss, {model}/{corpus}, mean of seeds {seeds}:\n")
        print(transformer_study.curve_table(results, model, corpus, seeds, names))
        if args.plot:
            Path(args.plot).mkdir(parents=True, exist_ok=True)
            transformer_study.plot(results, model, corpus, seeds, names, Path(args.plot) / f"{model}-{corpus}.png")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # a rank under mpirun
        transformer_runs.mpi_worker_main(*sys.argv[2:], make_hook=make_hook)
    else:
        main()
