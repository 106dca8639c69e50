#!/usr/bin/env python3
"""What one ``dsopt.torch.AdamW.step()`` costs over many small tensors,
where the per-tensor Python work of a step shows: 10,000 fp32 parameters
of 16 elements each (default), ``.grad`` filled in place between steps
(the gradient descriptors stay cached, as in a training loop whose
``zero_grad(set_to_none=False)`` or autograd accumulation keeps the
``.grad`` objects), one process.

Rows, each timed in ``--runs`` runs of ``--steps`` calls (the mean per
call of each run), the variants interleaved run by run so that load from
elsewhere on the machine hits them alike; the script prints the median,
min and max over the runs:

* ``step()``, and ``step()`` without the check of the parameters'
  storage (made a no-op, as before it existed): what following moved
  parameters costs;
* the same two for the Python part alone (the call into dsopt_step
  replaced by returning the last result);
* the check alone (``data_ptr()`` of every parameter, compared with
  dsopt's), and the read of every ``.grad`` that ``step()`` makes anyway,
  for scale.

``--torch`` adds torch.optim.AdamW (foreach=False and, where it exists,
foreach=True), slow here (a few hundred ms per step).

    bench/torch_step_overhead.py [--tensors N] [--numel K] [--steps S] [--runs R] [--torch]
"""

import argparse
import operator
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its pools

import torch  # noqa: E402

try:  # the dsopt on sys.path (PYTHONPATH), else this checkout's
    import dsopt.torch
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "bindings", "python"))
    import dsopt.torch


def make_params(tensors, numel):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(numel, generator=gen)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn(numel, generator=gen) * 1e-3
    return params


def time_interleaved(variants, calls, runs):
    """{name: [mean seconds per call of each run]}: ``variants`` maps a
    name to (set-up, call); each run sets up and times every variant in
    turn."""
    times = {name: [] for name in variants}
    for setup, call in variants.values():
        setup()
        for _ in range(3):
            call()  # warm-up: descriptors cached, buffers allocated
    for _ in range(runs):
        for name, (setup, call) in variants.items():
            setup()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def report(name, per_call):
    ms = [t * 1e3 for t in per_call]
    print(f"| {name} | {statistics.median(ms):.3f} | {min(ms):.3f} - {max(ms):.3f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--numel", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--torch", action="store_true", help="also time torch.optim.AdamW")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {a.tensors} fp32 tensors of {a.numel} elements, "
          f"{a.runs} runs of {a.steps} calls, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print("| what | ms per call (median) | min - max |\n| --- | ---: | ---: |")
    params = make_params(a.tensors, a.numel)
    opt = dsopt.torch.AdamW(params, lr=1e-3, threads=1)
    opt.step()
    info = opt.last_step_info
    real_step = opt.dsopt._step_with

    def variant(check, c_step):
        def setup():
            opt.__dict__.pop("_follow_params", None)
            if not check:
                opt._follow_params = lambda collective=True: None
            opt.dsopt._step_with = real_step if c_step else (lambda *args: info)
        return setup, opt.step

    get_grad = operator.attrgetter("grad")
    times = time_interleaved({
        "step()": variant(True, True),
        "step() without the storage check": variant(False, True),
        "step(), Python part": variant(True, False),
        "step(), Python part, without the storage check": variant(False, False),
        "the storage check alone": (variant(True, True)[0], opt._storage.moved),
        "every .grad read (step() does it anyway)": (lambda: None,
                                                      lambda: list(map(get_grad, params))),
    }, a.steps, a.runs)
    for name, per_call in times.items():
        report(name, per_call)
    variant(True, True)[0]()
    opt.close()
    if not a.torch:
        return
    for foreach in (False, True):
        try:
            ref = torch.optim.AdamW(make_params(a.tensors, a.numel), lr=1e-3, foreach=foreach)
        except TypeError:  # a torch without foreach
            continue
        report(f"torch.optim.AdamW(foreach={foreach}).step()",
               time_interleaved({"": (lambda: None, ref.step)}, 2, 3)[""])


if __name__ == "__main__":
    main()
