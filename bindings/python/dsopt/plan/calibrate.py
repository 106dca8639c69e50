"""Calibration: times the library's own work through its public API on
this machine, in well under a minute, as seconds per element
(profile.py's costs).

* Update rules: an optimizer step at one rank on a local communicator
  (AdamW, ZeRO-2, 1-bit Adam's and 1-bit LAMB's warmup and compression
  stages, 0/1 Adam's full and local steps).
* Compression and the codecs: at one rank nothing is compressed, so these
  run at two ranks on a communicator whose callbacks stand in for a peer
  that holds the same values (`fake_peer`): every rank of a real run does
  the same work per element, so the time of rank 0's step less the update
  measured alone is the 1-bit path's (worker and server compression) or a
  codec pair's (encoding every piece, decoding the received ones, the
  parameter codec). The callbacks' own copies are counted in (a real
  communicator copies as much).
* The network (`measure_network`): AdamW steps of a tiny and of a large
  model on the caller's communicator, less the update, give the latency
  and the bandwidth of its allreduce.

Every timed step starts with cold caches: a sweep through twice the
largest cache (the CPU's last level, or the GPU's L2) comes before it,
untimed. In training, forward and backward sweep the caches between two
optimizer steps, and a model whose state fit in a large last-level cache
(hundreds of MiB on some servers) would otherwise be timed at the cache's
speed rather than memory's.

``device="cuda"`` (a CUDA build, a GPU and torch): the same steps on the
current GPU, parameters and gradients in device memory, the stand-in peer
working on torch tensors, every step synchronised before its time is
taken."""

import os
import time

from .profile import Profile

GRADIENT_CODECS = ("none", "int8", "int4", "sign")
PARAMETER_CODECS = ("none", "bf16", "int8")


def _sizes(numel, tensors=8):
    """`numel` elements in `tensors` tensors of odd sizes."""
    base = numel // tensors
    sizes = [base + (2 * i + 1) * 7 for i in range(tensors - 1)]
    sizes.append(numel - sum(sizes))
    return sizes


def fake_peer(world=2, buffers="numpy"):
    """A communicator of `world` ranks on which this process is rank 0 and
    every other rank holds exactly what it holds (collectives on numpy
    buffers, or torch tensors: device buffers)."""
    import dsopt

    def allreduce(send, recv, op):
        if op == "sum":
            recv[:] = send * world
        elif send is not recv:
            recv[:] = send

    def reduce_scatter(send, recv, op):
        recv[:] = send[:len(recv)] * (world if op == "sum" else 1)

    def allgather(send, recv):
        k = len(send)
        for r in range(world):
            recv[r * k:(r + 1) * k] = send

    def alltoall(send, recv):
        k = len(send) // world
        for r in range(world):
            recv[r * k:(r + 1) * k] = send[:k]   # rank r's block for rank 0 equals ours

    return dsopt.Communicator.from_callbacks(0, world, allreduce=allreduce, reduce_scatter=reduce_scatter,
                                             allgather=allgather, alltoall=alltoall, buffers=buffers)


# Sweep size when the cache size is unknown.
_UNKNOWN_CACHE = 64 << 20
# The CPU's caches, one folder each (index0, index1, ...) with their "size".
SYSFS_CACHE = "/sys/devices/system/cpu/cpu0/cache"


def cache_bytes(device="cpu") -> int:
    """The largest cache between the kernels and memory, in bytes: the CPU's
    last level (from sysfs) or the current GPU's L2; 0 when unknown."""
    if device != "cpu":
        import torch

        return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0))
    base = SYSFS_CACHE
    best = 0
    try:
        entries = os.listdir(base)
    except OSError:
        return 0
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text[:-1] if text[-1:] in "KMG" else text
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best


class CacheSweep:
    """Evicts the caches: reads a buffer of twice the largest cache (64 MiB
    of it when the size is unknown) on the CPU, or writes one on the GPU."""

    def __init__(self, device="cpu"):
        import numpy as np

        self.device = device
        nbytes = 2 * (cache_bytes(device) or _UNKNOWN_CACHE)
        if device == "cpu":
            self.buffer = np.ones(nbytes // 4, np.float32)
        else:
            import torch

            self.buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=device)

    def __call__(self):
        if self.device == "cpu":
            float(self.buffer.sum())
        else:
            self.buffer.fill_(1.0)
            _synchronize(self.device)


def time_steps(config, sizes, comm, steps=5, warmup=2, device="cpu"):
    """(The shortest of `steps` optimizer steps after `warmup` ones, the
    optimizer's thread count)."""
    (t,), threads = time_interleaved([(config, comm)], sizes, steps, warmup, device)
    return t, threads


def _arrays(sizes, scale, rng, device):
    """Random fp32 arrays of `sizes`: numpy on the CPU, torch tensors on
    the current GPU for "cuda"."""
    import numpy as np

    arrays = [(rng.standard_normal(n) * scale).astype(np.float32) for n in sizes]
    if device == "cpu":
        return arrays
    import torch

    return [torch.from_numpy(a).to(device) for a in arrays]


def _synchronize(device):
    """Waits for the work queued on the GPU (nothing on the CPU)."""
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def time_interleaved(runs, sizes, steps=5, warmup=2, device="cpu"):
    """([the shortest step of each run], threads of the first): every
    (config, communicator) of `runs` steps once per round, in turn, so the
    costs that are subtracted from each other see the same load; the
    shortest step is the one least disturbed by other work. Each step
    starts with cold caches (CacheSweep). On "cuda" each step is timed to
    the end of its device work."""
    import contextlib
    import warnings

    import numpy as np
    import dsopt

    rng = np.random.default_rng(0)
    sweep = CacheSweep(device)
    params = [_arrays(sizes, 0.1, rng, device) for _ in runs]
    grads = _arrays(sizes, 1e-2, rng, device)
    times = [[] for _ in runs]
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # The stand-in peer's gradients equal this rank's, which dsopt notices.
        warnings.simplefilter("ignore", dsopt.DoubleReductionWarning)
        opts = [stack.enter_context(dsopt.Optimizer(cfg, p, comm=comm)) for (cfg, comm), p in zip(runs, params)]
        for k in range(warmup + steps):
            for opt, out in zip(opts, times):
                sweep()
                _synchronize(device)
                t0 = time.perf_counter()
                opt.step(grads)
                _synchronize(device)
                if k >= warmup:
                    out.append(time.perf_counter() - t0)
        threads = opts[0].threads
    return [min(t) for t in times], threads


def other_update_rules() -> list:
    """The registered algorithms without compressed communication, each
    description once, but the baseline (AdamW, whose costs are "adamw" and
    "zero_update")."""
    from .algorithms import BASELINE, describe, names, same_but_name

    seen, out = {same_but_name(describe(BASELINE))}, []
    for t in names():
        a = describe(t)
        if not a.compressed and same_but_name(a) not in seen:
            seen.add(same_but_name(a))
            out.append(a)
    return out


def _cfg(kind, zero=None, threads=0, **params):
    cfg = {"optimizer": {"type": kind, "params": {"lr": 1e-4, **params}}, "threads": threads}
    if zero:
        cfg["zero_optimization"] = zero
    return cfg


def calibrate(numel=2 ** 21, steps=7, threads=0, log=None, device="cpu") -> Profile:
    """Times every cost of the profile on a model of `numel` fp32 elements
    with `threads` CPU threads per optimizer (0: what a rank alone on this
    machine gets by default; give a run's own share, e.g. 1 for as many
    single-threaded ranks as cores), on the CPU or (`device="cuda"`) on the
    current GPU."""
    import dsopt

    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    say = log or (lambda *_: None)
    start = time.perf_counter()
    sizes = _sizes(numel)
    n = sum(sizes)
    costs = {}
    local = dsopt.Communicator.local()
    peer = fake_peer(2, "numpy" if device == "cpu" else "torch")
    big = {"stage": 2, "reduce_bucket_size": 2 ** 30, "allgather_bucket_size": 2 ** 30}
    padded = -(-n // 4) * 4  # ZeRO's n' at 2 ranks (a multiple of 2P; at one rank of 2)

    if threads == 0:
        threads = time_steps(_cfg("AdamW"), [16], local, 1, 0)[1]

    def group(*runs):
        """Times `runs` (name, config, communicator) interleaved: {name: seconds}."""
        for _, cfg, _ in runs:
            cfg["threads"] = threads
            if device != "cpu":
                cfg["device"] = device
        ts, _ = time_interleaved([(cfg, comm) for _, cfg, comm in runs], sizes, steps,
                                 device=device)
        return {name: t for (name, _, _), t in zip(runs, ts)}

    def cost(name, seconds, per, sub=0.0):
        costs[name] = max(0.0, (seconds - sub) / per)
        say(f"  {name:24s} {seconds * 1e3:8.2f} ms per step  ({costs[name] * 1e9:.3f} ns per element)")

    say(f"calibrating on {n:,} fp32 elements ({len(sizes)} tensors), {threads} thread(s), "
        f"{steps} timed steps each, related ones interleaved")
    cost("adamw", group(("adamw", _cfg("AdamW"), local))["adamw"], n)
    # The other update rules the library registers (one of each description
    # alike but for its name), at stage 0 and under ZeRO-2 where they run
    # there; the planner scales AdamW's costs for any the profile lacks.
    for a in other_update_rules():
        runs = [(f"update:{a.type}", _cfg(a.type), local)]
        if a.zero:
            runs.append((f"zero_update:{a.type}", _cfg(a.type, big), local))
        try:
            t = group(*runs)
        except (dsopt.Unsupported, dsopt.InvalidArgument) as exc:  # e.g. no kernel on this device
            say(f"  {a.type}: not timed here ({exc}); the planner scales AdamW's costs")
            continue
        cost(f"update:{a.type}", t[f"update:{a.type}"], n)
        if a.zero:
            cost(f"zero_update:{a.type}", t[f"zero_update:{a.type}"], -(-n // 2) * 2)
    pairs = [(g, p) for g in GRADIENT_CODECS for p in PARAMETER_CODECS if (g, p) != ("none", "none")]
    t = group(("zero_update", _cfg("AdamW", big), local), ("zero_pack", _cfg("AdamW", big), peer),
              *((f"codec:{g}/{p}", _cfg("AdamW", dict(big, compression={"gradients": g, "parameters": p})), peer)
                for g, p in pairs))
    cost("zero_update", t["zero_update"], -(-n // 2) * 2)
    cost("zero_pack", t["zero_pack"], n, costs["zero_update"] * padded / 2)
    for g, p in pairs:
        cost(f"codec:{g}/{p}", t[f"codec:{g}/{p}"], n, t["zero_pack"])
    t = group(("update", _cfg("OneBitAdam", freeze_step=2), local), ("compress", _cfg("OneBitAdam", freeze_step=2), peer))
    cost("onebit_adam_update", t["update"], n)
    cost("onebit_adam_compress", t["compress"], n, t["update"])
    t = group(("warmup", _cfg("OneBitLamb", freeze_step=10 ** 6), local),
              ("update", _cfg("OneBitLamb", freeze_step=2), local), ("compress", _cfg("OneBitLamb", freeze_step=2), peer))
    cost("onebit_lamb_warmup", t["warmup"], n)
    cost("onebit_lamb_update", t["update"], n)
    cost("onebit_lamb_compress", t["compress"], n, t["update"])
    # Full steps only; then frozen after the first update, with syncs at
    # doubling intervals up to 16 (mostly local steps); and a sync every step.
    t = group(("full", _cfg("ZeroOneAdam", var_freeze_step=10 ** 6, var_update_scaler=10 ** 6), local),
              ("local", _cfg("ZeroOneAdam", var_freeze_step=0, local_step_scaler=1, local_step_clipper=16), local),
              ("sync", _cfg("ZeroOneAdam", var_freeze_step=0, local_step_scaler=10 ** 6), peer))
    cost("zoadam_full", t["full"], n)
    cost("zoadam_local", t["local"], n)
    cost("zoadam_compress", t["sync"], n, t["local"])
    peer.close()
    where = _gpu_name() if device == "cuda" else f"{_cpu_name()}, {threads} thread(s)"
    return Profile(costs, True, f"{where}, {dsopt.build_info().split()[-1]}", "fp32", n,
                   None, time.perf_counter() - start)


def calibrate_concurrent(copies, numel=2 ** 21, threads=0, log=None, device="cpu") -> Profile:
    """`calibrate` in `copies` processes at once, each cost the mean of
    theirs: the costs with every core busy, as they are when ranks fill
    the machine (N single-threaded ranks on N cores, or more ranks than
    cores), where the cores share the memory bandwidth that one process
    timed alone has to itself. 1: `calibrate` itself."""
    import subprocess
    import sys
    import tempfile

    import dsopt

    from .profile import load

    if copies < 1:
        raise ValueError(f"concurrent copies must be >= 1, got {copies}")
    if copies == 1:
        return calibrate(numel, threads=threads, log=log, device=device)
    say = log or (lambda *_: None)
    start = time.perf_counter()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(dsopt.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryDirectory() as tmp:
        paths = [os.path.join(tmp, f"copy{i}.json") for i in range(copies)]
        procs = [subprocess.Popen([sys.executable, "-m", "dsopt.plan", "--calibrate", "--threads", str(threads),
                                   "--calibrate-numel", str(numel), "--calibrate-device", device, "--profile", path],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
                 for path in paths]
        errors = [proc.communicate()[1] for proc in procs]
        failed = [f"copy {i}: {err.strip()}" for i, (proc, err) in enumerate(zip(procs, errors)) if proc.returncode]
        if failed:
            raise RuntimeError("concurrent calibration failed: " + "; ".join(failed))
        profiles = [load(path, required=True) for path in paths]
    costs = {k: sum(p.costs[k] for p in profiles) / copies for k in profiles[0].costs}
    for k in sorted(costs):
        spread = [p.costs[k] * 1e9 for p in profiles]
        say(f"  {k:24s} {costs[k] * 1e9:.3f} ns per element (copies: {min(spread):.3f}-{max(spread):.3f})")
    first = profiles[0]
    return Profile(costs, True, f"{first.device}, {copies} copies at once", first.dtype, first.numel, None,
                   time.perf_counter() - start)


def _gpu_name():
    import torch

    return f"{torch.cuda.get_device_name()} (GPU)"


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"CPU ({os.cpu_count()} cores)"


def measure_network(comm, profile: Profile, large=2 ** 22, steps=5) -> dict:
    """Latency and bandwidth of `comm` (a dsopt.Communicator of P ranks;
    collective: call on every rank): AdamW steps on a 16-element model and
    on a `large` one; the update (from `profile`) is taken off. Returns
    {"ranks", "latency" (s per round), "bandwidth" (bytes/s each rank's
    ring allreduce moves), "communicator"}; put it in profile.network."""
    from math import ceil, log2

    from . import bytes as pbytes

    P = comm.size if hasattr(comm, "size") else None
    t_small, _ = time_steps(_cfg("AdamW"), [16], comm, steps)
    t_large, _ = time_steps(_cfg("AdamW"), _sizes(large), comm, steps)
    if P is None or P < 2:
        raise ValueError("measure_network needs a communicator of at least 2 ranks")
    rounds = 2 * ceil(log2(P)) + 2 * (P - 1)
    latency = t_small / rounds
    moved = pbytes.full_allreduce(large, P) - pbytes.full_allreduce(16, P)
    wire = t_large - t_small - profile.cost("adamw") * large
    if wire <= 0:
        raise ValueError("the large allreduce took no longer than the small one: the link is too fast to measure "
                         f"with {large} elements (use a larger model)")
    return {"ranks": P, "latency": latency, "bandwidth": moved / wire, "communicator": getattr(comm, "kind", "?")}


def measure_compute(step, steps=5, warmup=2, synchronize=None) -> float:
    """The median seconds of `step()` (your forward and backward, without
    the optimizer step) over `steps` calls after `warmup`: the planner's
    compute time. `synchronize` (e.g. torch.cuda.synchronize) is called
    before each clock reading when the work is asynchronous."""
    import statistics

    if steps < 1 or warmup < 0:
        raise ValueError(f"steps must be >= 1 and warmup >= 0, got {steps} and {warmup}")
    sync = synchronize or (lambda: None)
    times = []
    for k in range(warmup + steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if k >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
