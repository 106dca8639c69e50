#!/usr/bin/env python3
"""dsopt's CPU AdamW against what a PyTorch user would pick instead, in one
process and one run.

Contenders, for each case, all timed in interleaved rounds (one step of each
per round, so that load from elsewhere on the machine hits them alike; each
step after an untimed pause of SETTLE_S, so that it starts on idle cores):
  - a streaming probe that moves AdamW's bytes with trivial arithmetic
    (bench/stream_probe.cpp, loaded from libdsopt_bench_probe.so): what the
    memory system allows, the reference of every ratio;
  - the same probe after a read of the gradients in a pass of its own
    (8 streams per thread): the least that a check of the gradients before
    the update (the default config's one extra read) can cost on this
    machine;
  - dsopt through the C API (dsopt_step called through cffi with a
    descriptor array built once), through the numpy API
    (dsopt.Optimizer.step) and through dsopt.torch.AdamW, each with the
    default config, with "skip_nonfinite": false, and with the checks off
    ("skip_nonfinite": false and "divergence_check": {"enabled": false}:
    the update alone);
  - torch.optim.AdamW with fused=True, foreach=True and the for-loop
    (foreach=False), where this torch has them;
  - DeepSpeed's DeepSpeedCPUAdam (adamw_mode), where DeepSpeed is installed.
A contender that is missing is skipped with a message.

Cases: one tensor of 50M, 100 of 500K, 10,000 of 1,000 fp32 parameters, and
one tensor of 50M bf16 parameters with fp32 masters (torch and DeepSpeed keep
the masters by hand: gradients converted to fp32 before the step, the
parameters rounded back after it, both timed). Every AdamW contender's
parameters are checked afterwards against a float64 AdamW on a sample of
elements. Bytes: 28 per parameter for everyone (read p, g, m, v; write p,
m, v), so GB/s and ratios compare time.

    adam_cpu_peers.py [--threads T] [--rounds R] [--warmup W] [--scale S] [--cases LIST]

--scale divides every tensor count and size (for quick runs); --cases picks
cases by number (1-4, comma-separated).
"""

import argparse
import os
import sys
import time

_THREADS = int(os.environ.get("DSOPT_BENCH_THREADS", "2"))
os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))  # before numpy/torch start pools

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bindings", "python"))

import dsopt  # noqa: E402
from dsopt import ffi, lib  # noqa: E402

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
BYTES_PER_PARAM = 28
SAMPLES = 4096


def note(text):
    print(f"  [{text}]", flush=True)


# ---- data and the reference --------------------------------------------------


class Case:
    def __init__(self, number, title, count, size, bf16):
        self.number, self.title, self.count, self.size, self.bf16 = number, title, count, size, bf16
        self.numel = count * size
        rng = np.random.default_rng(number)
        self.p0 = rng.uniform(-1, 1, self.numel).astype(np.float32)
        self.g = (1e-2 * rng.uniform(-1, 1, self.numel)).astype(np.float32)
        if bf16:
            self.p0_bits, self.g_bits = to_bf16_bits(self.p0), to_bf16_bits(self.g)
            self.p0, self.g = from_bf16_bits(self.p0_bits), from_bf16_bits(self.g_bits)
        self.sample = np.linspace(0, self.numel - 1, SAMPLES).astype(np.int64)

    def pieces(self, flat):
        """Views of `flat` cut into this case's tensors."""
        return [flat[k * self.size:(k + 1) * self.size] for k in range(self.count)]

    def reference(self, steps):
        """float64 AdamW on the sampled elements after `steps` steps."""
        p = self.p0[self.sample].astype(np.float64)
        g = self.g[self.sample].astype(np.float64)
        m, v = np.zeros_like(p), np.zeros_like(p)
        for t in range(1, steps + 1):
            p *= 1 - LR * WD
            m = BETAS[0] * m + (1 - BETAS[0]) * g
            v = BETAS[1] * v + (1 - BETAS[1]) * g * g
            denom = np.sqrt(v) / np.sqrt(1 - BETAS[1] ** t) + EPS
            p -= LR / (1 - BETAS[0] ** t) * m / denom
        return p


def to_bf16_bits(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---- contenders ----------------------------------------------------------------
# Each has .name, .step() and .sample(case) (the parameters at case.sample,
# as float64), or raises Skip from its constructor.


class Skip(Exception):
    pass


class Probe:
    name = "streaming probe (read 4, write 3 arrays)"

    def __init__(self, case, probe):
        n, self.case = case.numel, case
        self.m, self.v = np.zeros(n, np.float32), np.zeros(n, np.float32)
        self.master = case.p0.copy()
        if case.bf16:
            self.g16, self.p16 = case.g_bits.copy(), np.zeros(n, np.uint16)
            args = [self.master, self.g16, self.m, self.v, self.p16]
            types = ["float *", "uint16_t *", "float *", "float *", "uint16_t *"]
            fn = probe[1].dsopt_bench_probe_16
        else:
            self.g = case.g
            args = [self.master, self.g, self.m, self.v]
            types = ["float *"] * 4
            fn = probe[1].dsopt_bench_probe_f32
        ptrs = [probe[0].cast(t, a.ctypes.data) for t, a in zip(types, args)]
        self.step = lambda: fn(*ptrs, n)

    sample = None


class ProbeAfterRead(Probe):
    name = "streaming probe after a read pass (the default's least)"

    def __init__(self, case, probe):
        super().__init__(case, probe)
        update = self.step
        if case.bf16:
            read, g = probe[1].dsopt_bench_probe_read_16, probe[0].cast("uint16_t *", self.g16.ctypes.data)
        else:
            read, g = probe[1].dsopt_bench_probe_read_f32, probe[0].cast("float *", self.g.ctypes.data)
        n = case.numel

        def step():
            read(g, n)
            update()
        self.step = step


# The dsopt configs timed: the default, without the skip, without any check.
CHECKS = ("default config", "skip_nonfinite false", "checks off")


def dsopt_config(threads, checks):
    config = {"optimizer": {"type": "AdamW", "params": {
        "lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}}, "threads": threads}
    if checks != CHECKS[0]:
        config["skip_nonfinite"] = False
    if checks == CHECKS[2]:
        config["divergence_check"] = {"enabled": False}
    return config


class DsoptNumpy:
    """dsopt.Optimizer over numpy arrays: `direct` calls dsopt_step with a
    descriptor array built once (the C API's cost), else Optimizer.step."""

    def __init__(self, case, threads, checks, direct):
        self.case = case
        self.name = f"dsopt {'C API' if direct else 'numpy'}, {checks}"
        if case.bf16:
            self.flat = case.p0_bits.copy()
            params = [dsopt.bf16(a) for a in case.pieces(self.flat)]
            grads = [dsopt.bf16(a) for a in case.pieces(case.g_bits)]
        else:
            self.flat = case.p0.copy()
            params, grads = case.pieces(self.flat), case.pieces(case.g)
        self.opt = dsopt.Optimizer(dsopt_config(threads, checks), params)
        if direct:
            from dsopt.tensors import TensorList
            self._grads = TensorList(grads, writable=False, kind="grads")
            info = ffi.new("dsopt_step_info *")
            info.struct_size = ffi.sizeof("dsopt_step_info")
            handle, array, count = self.opt.handle, self._grads.c_array, len(self._grads)

            def step():
                dsopt.check(lib.dsopt_step(handle, array, count, info))
            self.step = step
        else:
            self.step = lambda: self.opt.step(grads)

    def sample(self, case):
        x = self.flat[case.sample]
        return (from_bf16_bits(x) if case.bf16 else x).astype(np.float64)


def import_torch():
    try:
        import torch
    except ImportError as error:
        raise Skip(f"torch is not installed ({error}); pip install torch")
    return torch


class DsoptTorch:
    def __init__(self, case, threads, checks):
        torch = import_torch()
        import dsopt.torch as dsopt_torch
        self.case = case
        self.name = f"dsopt.torch.AdamW, {checks}"
        dtype = torch.bfloat16 if case.bf16 else torch.float32
        self.params = [torch.nn.Parameter(torch.from_numpy(a.copy()).to(dtype))
                       for a in case.pieces(case.p0)]
        grads = [torch.from_numpy(a).to(dtype) for a in case.pieces(case.g)]
        for p, g in zip(self.params, grads):
            p.grad = g
        # torch.optim.AdamW's one-line replacement
        self.opt = dsopt_torch.AdamW(self.params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                     threads=threads, skip_nonfinite=checks == CHECKS[0],
                                     divergence_check=checks != CHECKS[2])
        self.step = self.opt.step

    def sample(self, case):
        flat = np.concatenate([p.detach().float().numpy() for p in self.params])
        return flat[case.sample].astype(np.float64)


class TorchAdamW:
    """torch.optim.AdamW; with bf16 parameters, fp32 masters kept by hand."""

    def __init__(self, case, threads, mode):
        torch = import_torch()
        torch.set_num_threads(threads)
        self.name = f"torch AdamW {mode} (torch {torch.__version__.split('+')[0]})"
        flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
                 "for-loop": {"foreach": False}}[mode]
        self.masters = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in case.pieces(case.p0)]
        try:
            self.opt = torch.optim.AdamW(self.masters, lr=LR, betas=BETAS, eps=EPS,
                                         weight_decay=WD, **flags)
        except (RuntimeError, TypeError, ValueError) as error:
            raise Skip(f"{self.name}: {error}")
        self.step = self._setup_step(case, torch)

    def _setup_step(self, case, torch):
        if not case.bf16:
            for p, g in zip(self.masters, case.pieces(case.g)):
                p.grad = torch.from_numpy(g)
            return self.opt.step
        self.p16 = [p.detach().to(torch.bfloat16) for p in self.masters]
        self.g16 = [torch.from_numpy(g).to(torch.bfloat16) for g in case.pieces(case.g)]
        for p in self.masters:
            p.grad = torch.empty_like(p)

        def step():
            with torch.no_grad():
                for p, g in zip(self.masters, self.g16):
                    p.grad.copy_(g)
                self.opt.step()
                for p16, p in zip(self.p16, self.masters):
                    p16.copy_(p)
        return step

    def sample(self, case):
        tensors = self.p16 if getattr(self, "p16", None) else self.masters
        flat = np.concatenate([t.detach().float().numpy() for t in tensors])
        return flat[case.sample].astype(np.float64)


class DeepSpeedAdam(TorchAdamW):
    def __init__(self, case, threads):
        torch = import_torch()
        try:
            import deepspeed
            from deepspeed.ops.adam import DeepSpeedCPUAdam
        except Exception as error:  # missing, or its import fails on this machine
            raise Skip(f"DeepSpeed is not usable ({type(error).__name__}: {error}); "
                       f"pip install deepspeed")
        torch.set_num_threads(threads)
        self.name = f"DeepSpeedCPUAdam (deepspeed {deepspeed.__version__})"
        self.masters = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in case.pieces(case.p0)]
        try:
            self.opt = DeepSpeedCPUAdam(self.masters, lr=LR, betas=BETAS, eps=EPS,
                                        weight_decay=WD, adamw_mode=True)
        except Exception as error:  # the op is built on first use and may fail
            raise Skip(f"{self.name}: {type(error).__name__}: {error}")
        self.step = self._setup_step(case, torch)


# ---- timing and the table ------------------------------------------------------


def contenders_for(case, args, probe):
    makers = [lambda: Probe(case, probe), lambda: ProbeAfterRead(case, probe)]
    for checks in CHECKS:
        makers.append(lambda checks=checks: DsoptNumpy(case, args.threads, checks, direct=True))
        makers.append(lambda checks=checks: DsoptNumpy(case, args.threads, checks, direct=False))
        makers.append(lambda checks=checks: DsoptTorch(case, args.threads, checks))
    for mode in ("fused", "foreach", "for-loop"):
        makers.append(lambda mode=mode: TorchAdamW(case, args.threads, mode))
    makers.append(lambda: DeepSpeedAdam(case, args.threads))
    out = []
    for make in makers:
        try:
            out.append(make())
        except Skip as why:
            note(f"skipped: {why}")
    return out


# Untimed pause before each step: the OpenMP threads of the contender before
# (the probe's, torch's, DeepSpeed's) spin for a while after their last
# parallel region (libgomp's GOMP_SPINCOUNT; tens of milliseconds where the
# CPU's pause instruction is slow), taking the cores from whoever starts
# next. The pause lets them fall asleep, so every step starts on idle cores.
SETTLE_S = 0.05


def time_rounds(contenders, warmup, rounds):
    times = [[] for _ in contenders]
    for r in range(warmup + rounds):
        for k, c in enumerate(contenders):
            time.sleep(SETTLE_S)
            start = time.perf_counter()
            c.step()
            elapsed = time.perf_counter() - start
            if r >= warmup:
                times[k].append(elapsed)
    return times


def check(case, contenders, steps):
    ref = case.reference(steps)
    # fp32: roundings in whatever order each contender computes (DeepSpeed
    # differs from torch by up to ~2e-5 after a few steps); bf16: the
    # parameters' own rounding. A wrong rule misses by far more.
    tol = 2.0 ** -7 if case.bf16 else 1e-4
    for c in contenders:
        if c.sample is None:
            continue
        err = np.max(np.abs(c.sample(case) - ref) / np.maximum(np.abs(ref), 1e-3))
        if not err <= tol:
            sys.exit(f"adam_cpu_peers: {c.name} differs from the float64 AdamW reference "
                     f"(max relative error {err:.3g} > {tol:.3g})")


def run_case(case, args, probe):
    print(f"\n== case {case.number}: {case.title} ({case.count} x {case.size} = "
          f"{case.numel:,} parameters) ==", flush=True)
    contenders = contenders_for(case, args, probe)
    times = time_rounds(contenders, args.warmup, args.rounds)
    check(case, contenders, args.warmup + args.rounds)
    medians = [float(np.median(t)) for t in times]
    c_api = {c.name.split(", ")[1]: medians[k] for k, c in enumerate(contenders)
             if c.name.startswith("dsopt C API")}
    print(f"{'contender':58} {'median ms (min-max)':>24} {'GB/s':>7} {'vs probe':>9} {'vs C API':>9}")
    for k, c in enumerate(contenders):
        t = times[k]
        spread = f"{medians[k] * 1e3:.2f} ({min(t) * 1e3:.2f}-{max(t) * 1e3:.2f})"
        gbs = BYTES_PER_PARAM * case.numel / medians[k] / 1e9
        vs_probe = medians[0] / medians[k]
        config = c.name.split(", ")[1] if c.name.startswith("dsopt") else None
        vs_c = f"{c_api[config] / medians[k]:9.2f}" if config in c_api and \
            not c.name.startswith("dsopt C API") else f"{'':9}"
        print(f"{c.name:58} {spread:>24} {gbs:7.1f} {vs_probe:9.2f} {vs_c}", flush=True)
    for c in contenders:
        close = getattr(getattr(c, "opt", None), "close", None)
        if close:
            close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=_THREADS)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--cases", default="1,2,3,4")
    parser.add_argument("--probe-lib", default=os.environ.get("DSOPT_BENCH_PROBE_LIB"),
                        help="path of libdsopt_bench_probe.so")
    args = parser.parse_args()
    if not args.probe_lib:
        sys.exit("adam_cpu_peers: --probe-lib (or DSOPT_BENCH_PROBE_LIB) must name "
                 "libdsopt_bench_probe.so (built in <build>/bench)")
    import cffi
    probe_ffi = cffi.FFI()
    probe_ffi.cdef("""
        void dsopt_bench_probe_f32(float *p, const float *g, float *m, float *v, int64_t n);
        void dsopt_bench_probe_16(float *master, const uint16_t *g16, float *m, float *v,
                                  uint16_t *p16, int64_t n);
        float dsopt_bench_probe_read_f32(const float *g, int64_t n);
        float dsopt_bench_probe_read_16(const uint16_t *g16, int64_t n);""")
    probe = (probe_ffi, probe_ffi.dlopen(args.probe_lib))
    s = args.scale
    cases = [
        (1, "fp32, one tensor", 1, 50_000_000 // s, False),
        (2, "fp32, 100 tensors", 100, 500_000 // s, False),
        (3, "fp32, many small tensors", 10_000 // s, 1_000, False),
        (4, "bf16 parameters and gradients, fp32 masters, one tensor", 1, 50_000_000 // s, True),
    ]
    wanted = {int(x) for x in args.cases.split(",")}
    print("dsopt AdamW on the CPU against its peers, one process")
    print(f"dsopt:   {dsopt.build_info()}")
    print(f"python:  {sys.version.split()[0]}, numpy {np.__version__}; {args.threads} threads "
          f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')})")
    print(f"run:     {args.warmup} warm-up + {args.rounds} timed rounds per case, contenders "
          f"interleaved; ratios are of medians; {BYTES_PER_PARAM} B/param for every contender")
    for number, title, count, size, bf16 in cases:
        if number in wanted:
            run_case(Case(number, title, count, size, bf16), args, probe)
    print(f"\nchecked: every AdamW contender matches a float64 AdamW on {SAMPLES} sampled elements")


if __name__ == "__main__":
    main()
