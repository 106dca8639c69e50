"""Which elements the stabilized rule clamps when 1-bit Adam trains the GPT
of examples/python/gpt.py at 4 ranks (transformer_runs' user settings), and
how much of the update it removes.

Before chosen steps, rank 0 reads each tensor's momentum m (as decompressed
by the last compressed step, the same on every rank) and frozen v through
``opt.state`` and computes, with the bias correction of the library (m times
1 / (1 - beta1^t), v over 1 - beta2^K, K = freeze_step - 1), the fraction
of elements whose |m| exceeds stabilize_limit sqrt(v), the median of
|m| / sqrt(v) (the update in AdamW's units, before the clamp) and
||clamped update|| / ||update||.

    mpirun -np 4 python3 docs/design/onebit_clamp_stats.py [STABILIZE_LIMIT]
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))
import transformer_runs  # noqa: E402

STEPS_SHOWN = (60, 120, 200, 290)


def clamp_stats(model, opt, limit, frozen_after, beta1=0.9, beta2=0.999, eps=1e-8):
    t = opt.last_step_info.step
    rows = []
    for name, p in model.named_parameters():
        m = opt.state[p]["exp_avg"].numpy().ravel() / (1 - beta1 ** t)
        root = np.sqrt(opt.state[p]["exp_avg_sq"].numpy().ravel() / (1 - beta2 ** frozen_after))
        bound = limit * root
        update = m / (root + eps)
        clamped = np.clip(m, -bound, bound) / (root + eps)
        rows.append((name, float(np.mean(np.abs(m) > bound)), float(np.median(np.abs(update))),
                     float(np.linalg.norm(clamped) / max(np.linalg.norm(update), 1e-30))))
    return rows


def main():
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    limit = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    run = transformer_runs.TransformerRun("clamp_stats", "OneBitAdam", options={"stabilize_limit": limit},
                                          eval_every=100)
    frozen_after = transformer_runs.optimizer_kwargs(run)["freeze_step"] - 1

    def before_step(step, model, opt):
        if rank == 0 and step in STEPS_SHOWN:
            print(f"\nstep {step}: | tensor | clamped | median |m|/sqrt(v) | clamped/unclamped norm |")
            for row in clamp_stats(model, opt, limit, frozen_after):
                print("| %s | %.3f | %.3g | %.3f |" % row)

    result = transformer_runs.train(run, comm, rank, comm.Get_size(), before_step=before_step)
    if rank == 0:
        print(f"\nfinal validation loss {result.final_validation:.4f}")


if __name__ == "__main__":
    main()
