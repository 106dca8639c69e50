"""torch's fused and foreach CUDA AdamW, timed like bench/adam_cuda.cu: the
same parameter count and layouts, CUDA events, median of reps x iters steps.

    python3 bench/adam_cuda_torch.py [--numel N] [--tensors K]
"""
import argparse
import statistics

import torch


def time_steps(opt, iters, reps, warmup=3):
    for _ in range(warmup):
        opt.step()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            opt.step()
        b.record()
        b.synchronize()
        per_call.append(a.elapsed_time(b) * 1e-3 / iters)
    return statistics.median(per_call)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numel", type=int, default=100_000_000)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print("| case | ms per step | GB/s (28 B/param) |\n| --- | ---: | ---: |")
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16 params (no masters)")):
        for k in (1, a.tensors):
            each = a.numel // k
            params = [torch.nn.Parameter(torch.randn(each, device="cuda", dtype=dtype)) for _ in range(k)]
            for p in params:
                p.grad = 1e-2 * torch.randn_like(p)
            for impl in ("fused", "foreach"):
                opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **{impl: True})
                s = time_steps(opt, a.iters, a.reps)
                print(f"| torch AdamW {impl}, {label}, {k} tensor(s) | {s * 1e3:.3f} | "
                      f"{28 * each * k / s / 1e9:.0f} |")
            del params, opt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
