"""The project's benchmark set-ups on the emulated 1 Gbit/s link
(bench/netem.sh: 4 ranks whose TCP traffic shares one loopback limited to
1 Gbit/s, on a machine with 2 cores: each rank's single-threaded work gets
half a core), as planner inputs, with the step times docs/ recorded for
them. `predict_all(profile)` gives (set-up, predicted s, recorded s) rows;
bench/run_benchmarks.sh prints them beside its own measurements and
tests/python/test_plan.py checks them against the recorded ones."""

from dataclasses import dataclass

from .collectives import _car, comm_time
from .configs import Config, Settings
from .layout import car_largest_piece
from .model import Model
from .network import Cluster
from .timing import pipelined, step_time

RANKS, CORES = 4, 2
LINK = Cluster(RANKS, RANKS, 1e9 / 8, 1e9 / 8, 100e-6, 100e-6, "shared", RANKS / CORES)


@dataclass(frozen=True)
class Row:
    bench: str
    setup: str
    predicted: float
    recorded: float      # seconds, as docs/ record it (median), or as a run measured it
    source: str
    exposed: float = 0.0  # predicted communication not hidden (seconds)

    @property
    def link_bound(self) -> bool:
        """At least 3/4 of the predicted step is communication."""
        return self.exposed >= 0.75 * self.predicted

    @property
    def error(self) -> float:
        return self.predicted / self.recorded - 1


def _sizes(numel, tensors):
    """bench/zero_model.hpp's tensor_sizes: odd sizes that sum to numel
    (the split changes only a tensor count here, not the bytes)."""
    base = numel // tensors
    return tuple([base] * (tensors - 1) + [numel - base * (tensors - 1)])


def compressed_allreduce(profile, link=LINK):
    """bench/compressed_allreduce: one call on N floats per rank, fp32
    MPI_Allreduce against the 1-bit compressed allreduce (whose arithmetic
    runs while its pieces are on the wire, when there are several: a
    pipeline, timing.pipelined)."""
    rows = []
    for n, fp32, onebit in ((2 ** 20, 0.2003, 0.0055), (2 ** 24, 3.227, 0.1012)):
        rows.append(Row("compressed_allreduce", f"fp32 allreduce, {n:,} floats", link.allreduce(4 * n), fp32,
                        "docs/benchmarks.md", link.allreduce(4 * n)))
        wire = comm_time(_car([n], RANKS), link)
        work = profile.cost("onebit_adam_compress") * n * link.cpu_oversubscription
        total = pipelined(work, wire, car_largest_piece([n], RANKS, True)[0])
        rows.append(Row("compressed_allreduce", f"1-bit allreduce, {n:,} floats", total, onebit,
                        "docs/benchmarks.md", total - work))
    return rows


def _dsopt_step(config, model, settings, profile, link, kind="steady"):
    """(predicted seconds, exposed communication) of a dsopt_step."""
    t = step_time(config, model, link, settings, profile, 0.0, kind=kind)
    return t.total, t.exposed


def onebit_e2e(profile, link=LINK):
    """bench/onebit_e2e --in 63 --out 65536 (4,194,304 parameters): the
    dsopt_step part of an Adam step and of a 1-bit Adam compressed step."""
    model = Model((63 * 65536, 65536))
    s = Settings()
    adam = _dsopt_step(Config("adamw"), model, s, profile, link)
    onebit = _dsopt_step(Config("onebit_adam"), model, s, profile, link, "compressed")
    return [Row("onebit_e2e", "Adam dsopt_step, 4.19M", adam[0], 0.829, "docs/benchmarks.md", adam[1]),
            Row("onebit_e2e", "1-bit Adam compressed dsopt_step, 4.19M", onebit[0], 0.048, "docs/benchmarks.md",
                onebit[1])]


ZERO_SETTINGS = Settings(reduce_bucket_size=2 ** 22, allgather_bucket_size=2 ** 22)


def zero_e2e(profile, link=LINK):
    """bench/zero_e2e --numel 2^24 (36 tensors, 2^22-element buckets): stage 0 and ZeRO-2."""
    rows = []
    for dtype, stage0, zero2 in (("fp32", 3.276, 3.242), ("bf16", 3.259, 2.428)):
        model = Model(_sizes(2 ** 24, 36), dtype)
        for kind, label, rec in (("adamw", "stage 0", stage0), ("zero2", "ZeRO-2", zero2)):
            t, exposed = _dsopt_step(Config(kind), model, ZERO_SETTINGS, profile, link)
            rows.append(Row("zero_e2e", f"{label}, {dtype}", t, rec, "docs/guides/zero.md", exposed))
    return rows


COMPRESSED_ZERO = {  # gradients/parameters: (fp32 s, bf16 s), docs/guides/compressed-zero.md
    "none/none": (3.248, 2.440), "int4/int8": (0.786, 0.778), "int8/int8": (0.961, 0.949),
    "sign/int8": (0.688, 0.698), "int8/bf16": (1.356, 1.339), "int4/none": (1.992, 1.172),
}


def compressed_zero(profile, link=LINK):
    """bench/compressed_zero --numel 2^24: ZeRO-2 and codec pairs."""
    rows = []
    for pair, recorded in COMPRESSED_ZERO.items():
        g, p = pair.split("/")
        cfg = Config("zero2") if pair == "none/none" else Config("czero", g, p)
        for dtype, rec in zip(("fp32", "bf16"), recorded):
            model = Model(_sizes(2 ** 24, 36), dtype)
            t, exposed = _dsopt_step(cfg, model, ZERO_SETTINGS, profile, link)
            rows.append(Row("compressed_zero", f"{pair}, {dtype}", t, rec, "docs/guides/compressed-zero.md",
                            exposed))
    return rows


OVERLAP = [  # stage, backward ms (at once, grad_ready), total ms (grad_ready, at once): docs/guides/grad-ready.md
    (0, 1929, 1877, 3546, 5175), (0, 3861, 3537, 4203, 7107), (0, 7602, 6897, 7294, 10844),
    (2, 1915, 1743, 3584, 5161), (2, 3816, 3455, 5271, 7063), (2, 7583, 6683, 8498, 10826),
]


def overlap_e2e(profile, link=LINK):
    """bench/overlap_e2e: 16,793,600 fp32 elements in 32 tensors, 2^20-element
    buckets, a simulated backward (no forward) of the measured length; the
    step's total with gradients handed over and at once."""
    sizes = []
    for _ in range(16):
        sizes += [1024 * 1024, 1024]
    model = Model(tuple(sizes))
    s = Settings(reduce_bucket_size=2 ** 20)
    rows = []
    for stage, back_once, back_ready, total_ready, total_once in OVERLAP:
        kind = "adamw" if stage == 0 else "zero2"
        once = step_time(Config(kind), model, link, s, profile, back_once / 1e3, 1.0)
        ready = step_time(Config(kind, overlap=True), model, link, s, profile, back_ready / 1e3, 1.0)
        label = f"stage {stage}, backward {back_once / 1e3:.1f} s"
        # The backward is measured, not predicted: the comparison is of the rest.
        rows.append(Row("overlap_e2e", label + ", at once", once.total, total_once / 1e3, "docs/guides/grad-ready.md",
                        once.exposed + once.compute))
        rows.append(Row("overlap_e2e", label + ", grad_ready", ready.total, total_ready / 1e3,
                        "docs/guides/grad-ready.md", ready.exposed + ready.compute))
    return rows


def predict_all(profile, link=LINK):
    return (compressed_allreduce(profile, link) + onebit_e2e(profile, link) + zero_e2e(profile, link)
            + compressed_zero(profile, link) + overlap_e2e(profile, link))


def table(rows, reference="recorded s") -> str:
    out = [f"{'benchmark':22s} {'set-up':48s} {'predicted s':>11s} {reference:>10s} {'error':>7s}  bound by"]
    for r in rows:
        out.append(f"{r.bench:22s} {r.setup:48s} {r.predicted:11.4f} {r.recorded:10.4f} {r.error:+7.1%}  "
                   f"{'the link' if r.link_bound else 'the CPU'}")
    return "\n".join(out)


# ---- this machine's measurements -------------------------------------------

TITLES = {"1-bit compressed allreduce": "compressed_allreduce", "data-parallel training, 1-bit Adam vs Adam": "onebit_e2e",
          "ZeRO stage 1/2 vs stage 0": "zero_e2e", "Compressed ZeRO-2 vs uncompressed ZeRO-2": "compressed_zero",
          "Overlap of the gradient reduction with backward": "overlap_e2e"}


def _chunks(log):
    """{benchmark: its first output on the emulated link} from a log of
    bench/netem.sh runs (each starts with its "netem: namespace" line)."""
    out = {}
    for chunk in log.split("netem: namespace")[1:]:
        head = chunk.split("\n", 1)
        if len(head) < 2 or "limited to" not in head[0]:
            continue
        for title, bench in TITLES.items():
            if title in head[1][:300] and bench not in out:
                out[bench] = head[1]
    return out


def _number(pattern, text):
    import re

    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def measured_rows(log, profile, link=LINK) -> list:
    """Rows of the planner's prediction beside the step times that a log of
    bench/netem.sh runs measured (make bench's emulated runs; set-ups it
    cannot find are left out)."""
    import re

    pred = {(r.bench, r.setup): r for r in predict_all(profile, link)}
    rows = []

    def add(bench, setup, value, source="this run"):
        r = pred.get((bench, setup))
        if r is not None and value:
            rows.append(Row(bench, setup, r.predicted, value, source, r.exposed))

    chunks = _chunks(log)
    text = chunks.get("compressed_allreduce", "")
    for block in text.split("\nn = ")[1:]:
        n = int(block.split()[0])
        add("compressed_allreduce", f"fp32 allreduce, {n:,} floats", _number(r"MPI_Allreduce\s+([\d.]+)", block))
        add("compressed_allreduce", f"1-bit allreduce, {n:,} floats", _number(r"1-bit CAR\s+([\d.]+)", block))
    text = chunks.get("onebit_e2e", "")
    m = re.search(r"linear regression (\d+) -> (\d+), (\d+) parameters", text)
    if m:
        d_in, d_out = int(m.group(1)), int(m.group(2))
        model, s = Model((d_in * d_out, d_out)), Settings()
        for label, cfg, kind, pattern in (
                ("Adam dsopt_step", Config("adamw"), "steady", r"\nAdam\s+[\d.]+\s+[\d.]+\s+([\d.]+)"),
                ("1-bit Adam compressed dsopt_step", Config("onebit_adam"), "compressed",
                 r"1-bit Adam, compression stage\s+[\d.]+\s+[\d.]+\s+([\d.]+)")):
            t, exposed = _dsopt_step(cfg, model, s, profile, link, kind)
            value = _number(pattern, text)
            if value:
                rows.append(Row("onebit_e2e", f"{label}, {model.numel / 1e6:.2f}M", t, value, "this run", exposed))
    for part in chunks.get("zero_e2e", "").split("== step time: ")[1:]:
        dtype = part[:4]
        add("zero_e2e", f"stage 0, {dtype}", _number(r"stage 0\s+([\d.]+)", part))
        add("zero_e2e", f"ZeRO-2, {dtype}", _number(r"ZeRO-2\s+([\d.]+)", part))
    for part in chunks.get("compressed_zero", "").split("== step time: ")[1:]:
        dtype = part[:4]
        zero2 = []
        for m in re.finditer(r"\n(\w+/\w+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\d+ \|\s+([\d.]+)", part):
            add("compressed_zero", f"{m.group(1)}, {dtype}", float(m.group(2)))
            zero2.append(float(m.group(3)))
        if zero2:
            add("compressed_zero", f"none/none, {dtype}", sorted(zero2)[len(zero2) // 2])
    sizes = []
    for _ in range(16):
        sizes += [1024 * 1024, 1024]
    model, s = Model(tuple(sizes)), Settings(reduce_bucket_size=2 ** 20)
    for part in chunks.get("overlap_e2e", "").split("== stage ")[1:]:
        stage = int(part[0])
        kind = "adamw" if stage == 0 else "zero2"
        for m in re.finditer(r"\n([\d.]+) x T_c\s+[\d.]+ ms grad_ready\s+(\d+) \([^)]*\)\s+(\d+) \([^)]*\).*\n"
                             r"\s+at once\s+(\d+) \([^)]*\)\s+(\d+)", part):
            back_ready, total_ready, back_once, total_once = (int(m.group(i)) / 1e3 for i in (2, 3, 4, 5))
            label = f"stage {stage}, backward {float(m.group(1)):g} x T_c"
            for mode, cfg, back, total in (("at once", Config(kind), back_once, total_once),
                                           ("grad_ready", Config(kind, overlap=True), back_ready, total_ready)):
                t = step_time(cfg, model, link, s, profile, back, 1.0)
                rows.append(Row("overlap_e2e", f"{label}, {mode}", t.total, total, "this run", t.exposed + t.compute))
    return rows


def main(argv=None):
    import argparse

    from .profile import load

    ap = argparse.ArgumentParser(prog="python -m dsopt.plan.benchmarks",
                                 description="The planner's step times for make bench's set-ups on the emulated "
                                             "link, beside the recorded ones, or beside a log of this machine's runs.")
    ap.add_argument("profile", nargs="?", help="profile JSON (default: the saved one)")
    ap.add_argument("--measured", help="a log of bench/netem.sh runs (make bench writes <build>/bench/emulated.log)")
    args = ap.parse_args(argv)
    profile = load(args.profile)
    print(f"profile: {profile.label}")
    if args.measured:
        with open(args.measured) as f:
            rows = measured_rows(f.read(), profile)
        print("predicted beside this run's measurements:")
        print(table(rows, "measured s") if rows else "(no emulated-link run in the log)")
        print()
    print("predicted beside the step times the guides recorded:")
    print(table(predict_all(profile)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
