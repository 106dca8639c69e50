"""dsopt.plan, the planner: its bytes per rank per step and memory per rank
equal the library's for every configuration at 1-4 ranks (mpi_plan.py
under mpirun), its formulas give the guides' measured figures, bad input is
a clear error, and the command prints its table from a saved profile in
under a second."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import conftest
from dsopt.plan import bytes as pbytes
from dsopt.plan.configs import Config, Settings
from dsopt.plan.memory import memory
from dsopt.plan.model import Model
from dsopt.plan.units import parse_bandwidth, parse_count, parse_time

WORKER = conftest.HERE / "mpi_plan.py"


def run_worker(worker, world, tmp_path, least_checks):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", DSOPT_TEST_RESULTS=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(conftest.BINDING_DIR), str(conftest.HERE)]))
    proc = subprocess.run([shutil.which("mpirun"), "-np", str(world), "--oversubscribe", sys.executable,
                           str(worker)], env=env, capture_output=True, text=True, timeout=600)
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        result = json.loads(path.read_text())
        assert result["checks"] >= least_checks
        assert not result["mismatches"], "\n".join(result["mismatches"][:30])


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_bytes_and_memory_equal_the_library(world, tmp_path):
    run_worker(WORKER, world, tmp_path, 2001)


@pytest.mark.parametrize("world", [4, 6])
def test_bytes_across_nodes_and_memory_equal_the_library(world, tmp_path):
    """mpi_plan_nodes.py: sent and across nodes, every step, and memory
    per rank with its state part after every step, 2 x 2, 3 x 2 and 2 x 3,
    flat and node-aware (the 1-bit family also with the 1-bit node step,
    and on a model whose allreduces run in pieces), and node-aware on one
    node."""
    splits = sum(1 for r in range(2, world) if world % r == 0)
    run_worker(conftest.HERE / "mpi_plan_nodes.py", world, tmp_path,
               2 * (splits * (2 * 7 * 9 + 3 * 9 + 2 * 3 * 4) + 7 * 5 + 3 * 5))


# ---- the guides' measured figures ---------------------------------------

BIG = Settings(reduce_bucket_size=4194304, allgather_bucket_size=4194304)


@pytest.mark.parametrize("dtype,gradients,parameters,want", [
    ("fp32", "none", "none", 25_165_872), ("bf16", "none", "none", 18_874_416),
    ("fp32", "int8", "int8", 6_537_264), ("fp32", "int4", "int8", 4_964_400),
    ("bf16", "int4", "none", 8_060_976), ("fp32", "sign", "int8", 3_784_752),
    ("fp32", "none", "bf16", 18_874_416), ("bf16", "sign", "bf16", 6_881_328),
])
def test_compressed_zero_bytes_of_the_guide(dtype, gradients, parameters, want):
    # docs/guides/compressed-zero.md "Bytes per step per rank": Psi = 2^22 at 4 ranks.
    model = Model.from_params(4_194_304, dtype, tensors=36)
    kind = "zero2" if (gradients, parameters) == ("none", "none") else "czero"
    got = pbytes.step_bytes(Config(kind, gradients, parameters), model, 4, BIG).steady
    assert got == want


def test_zero_and_adamw_bytes_of_the_guide():
    # docs/guides/zero.md: Psi = 2^24 at 4 ranks.
    for dtype, kind, want in (("fp32", "adamw", 100_663_326), ("fp32", "zero2", 100_663_344),
                              ("bf16", "zero2", 75_497_520)):
        model = Model.from_params(2 ** 24, dtype, tensors=36)
        assert pbytes.step_bytes(Config(kind), model, 4, BIG).steady == want


def test_zero_memory_of_the_guide():
    # docs/guides/zero.md "Measured": bf16, Psi = 2^26 at 4 ranks, 272.0 MiB; stage 0 1024 MiB.
    model = Model.from_params(2 ** 26, "bf16", tensors=36)
    assert memory(Config("zero2"), model, 4, BIG).total == 272 * 2 ** 20
    assert memory(Config("adamw"), model, 4, BIG).total == 1024 * 2 ** 20 + 4


def test_onebit_adam_bytes_of_a_run():
    # 1-bit Adam on tensors of 1001, 437 and 2 elements at 2 ranks
    # (info.bytes_sent after the first three steps): the handshake, the
    # control allreduce, 1472 padded signs / 8 and 8 bytes of scales per tensor.
    sb = pbytes.step_bytes(Config("onebit_adam"), Model((1001, 437, 2)), 2, Settings())
    assert (sb.warmup, sb.compressed) == (5780, 240)


# ---- schedules -------------------------------------------------------------

def test_zero_one_adam_schedule():
    s = Settings(var_freeze_step=4, var_update_scaler=2, local_step_scaler=2, local_step_clipper=4)
    # Update u has k = u + 1: full when k % var_interval == 0 (interval 1 for
    # two full steps, then 2), frozen after k > 4; then local steps, synced
    # when k % local_interval == 0 (1 for two steps, then 2, then 4).
    assert pbytes.zoadam_phases(s, 10) == ["full", "full", "full", "1bit", "sync", "sync", "sync", "local",
                                           "local", "local"]


def test_onebit_average_counts_warmup_and_compressed_steps():
    s = Settings(steps=1000, freeze_step=200)
    model = Model.from_params(10 ** 6)
    sb = pbytes.step_bytes(Config("onebit_adam"), model, 4, s)
    total = pbytes.run_bytes(Config("onebit_adam"), model, 4, s)
    assert total == 199 * sb.warmup + 801 * sb.compressed + 3 * pbytes.check_bytes(4)


# ---- bad input -------------------------------------------------------------

@pytest.mark.parametrize("text,value", [("25gbit", 25e9 / 8), ("400Gbps", 50e9), ("12.5GB/s", 12.5e9),
                                        ("1 Gbit/s", 1.25e8), ("900GiB/s", 900 * 2 ** 30)])
def test_bandwidth_units(text, value):
    assert parse_bandwidth(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["25 furlongs", "fast", "-3gbit", "0gbit", ""])
def test_bad_bandwidth_is_a_clear_error(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


def test_counts_and_times():
    assert parse_count("1.3e9") == 1_300_000_000 and parse_count("7B") == 7 * 10 ** 9
    assert parse_count("125M") == 125 * 10 ** 6
    assert parse_time("5us") == pytest.approx(5e-6) and parse_time("1.5ms") == pytest.approx(1.5e-3)
    for bad in ("-4", "0", "many"):
        with pytest.raises(ValueError, match="ranks"):
            parse_count(bad, "ranks")
    with pytest.raises(ValueError, match="latency"):
        parse_time("3 parsecs", "latency")


def test_bad_model_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype"):
        Model((10,), "int3")
    with pytest.raises(ValueError, match="positive"):
        Model((10, 0))


# ---- the command -------------------------------------------------------------

def run_cli(*args, timeout=60):
    env = conftest.subprocess_env()
    return subprocess.run([sys.executable, "-m", "dsopt.plan", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_command_prints_every_configuration_and_a_choice(tmp_path):
    from dsopt.plan import configs

    out = run_cli("--params", "1.3e9", "--ranks", "64", "--ranks-per-node", "8", "--inter-node", "25gbit",
                  "--compute", "300ms", "--profile", str(tmp_path / "none.json"), "--plot", str(tmp_path / "p.png"))
    assert out.returncode == 0, out.stderr
    assert "UNCALIBRATED" in out.stdout
    for cfg in configs.all_configs():
        assert f"\n{cfg.name} " in out.stdout
    assert "\nchoice: " in out.stdout
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_the_table_takes_under_a_second_in_process(tmp_path, capsys):
    from dsopt.plan.__main__ import main
    from dsopt.plan.profile import Profile, save

    path = save(Profile(calibrated=True, device="test", numel=1), tmp_path / "p.json")
    start = time.perf_counter()
    assert main(["--params", "1.3e9", "--ranks", "64", "--ranks-per-node", "8", "--inter-node", "25gbit",
                 "--compute", "0.3", "--profile", str(path)]) == 0
    assert time.perf_counter() - start < 1.0
    assert "calibrated on test" in capsys.readouterr().out


def test_fsdp2_flag_adds_fsdp2_and_hsdp_rows_and_counts_the_callers_memory(tmp_path, capsys):
    from dsopt.plan import configs
    from dsopt.plan.__main__ import main

    # 350M fp32 parameters on 2 nodes of 4: the caller's parameters and
    # gradients are 2.6 GiB per rank replicated, 0.45 GiB under FSDP2.
    args = ["--params", "350M", "--ranks", "8", "--ranks-per-node", "4", "--compute", "300ms",
            "--profile", str(tmp_path / "none.json")]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--fsdp2", "--memory-limit", "1GiB"]) == 0
    out = capsys.readouterr().out
    rows = configs.fsdp_configs()
    assert {c.path for c in rows} == {"fsdp2", "hsdp"}
    for cfg in rows:
        assert f"\n{cfg.name} " in out and f"\n{cfg.name} " not in plain
    assert "caller/rank" in out and "caller/rank" not in plain
    # Counting the caller's memory, only FSDP2's rows fit 1 GiB (HSDP's
    # 1-bit rows, the fastest, do not).
    assert out.split("\nchoice: ")[1].startswith("FSDP2 ")
    assert main(args + ["--fsdp2"]) == 0
    assert "HSDP" in capsys.readouterr().out.split("\nchoice: ")[1].split(":")[0]


@pytest.mark.parametrize("args,message", [
    (("--params", "1e9", "--ranks", "-4"), "ranks"),
    (("--params", "1e9", "--ranks", "8", "--inter-node", "25 furlongs"), "inter-node bandwidth"),
    (("--params", "1e9", "--dtype", "int3"), "dtype"),
    (("--params", "many"), "parameter count"),
    (("--ranks", "8",), "give the model"),
    (("--params", "1e9", "--ranks", "12", "--ranks-per-node", "8"), "multiple of ranks per node"),
])
def test_bad_command_input_is_a_clear_error(args, message, tmp_path):
    out = run_cli(*args, "--profile", str(tmp_path / "none.json"))
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_calibration_writes_a_profile_the_command_reads(tmp_path):
    path = tmp_path / "prof.json"
    out = run_cli("--calibrate", "--calibrate-numel", "65536", "--threads", "1", "--profile", str(path),
                  timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(path.read_text())
    assert data["calibrated"] and data["numel"] == 65536
    from dsopt.plan.configs import GRADIENT_CODECS, PARAMETER_CODECS
    for g in GRADIENT_CODECS:
        for p in PARAMETER_CODECS:
            if (g, p) != ("none", "none"):
                assert data["costs"][f"codec:{g}/{p}"] >= 0
    assert all(v >= 0 for v in data["costs"].values())
    out = run_cli("--params", "1e8", "--ranks", "4", "--profile", str(path))
    assert out.returncode == 0 and "calibrated on" in out.stdout


def test_network_model_alpha_beta():
    from dsopt.plan.network import Cluster

    one_node = Cluster(8, 8, 100e9, 10e9, 1e-6, 1e-5)
    assert one_node.allreduce(8e9) == pytest.approx(14 * 1e-6 + 2 * 7 / 8 * 8e9 / 100e9)
    two = Cluster(16, 8, 100e9, 10e9, 1e-6, 1e-5)
    # The ring crosses each node's interface once: 2 (P-1)/P bytes at 10 GB/s.
    assert two.allreduce(8e9) == pytest.approx(30 * 1e-5 + 2 * 15 / 16 * 8e9 / 10e9)
    # An all-to-all sends R (P - R) / P of each rank's bytes off every node.
    assert two.alltoall(16e9) == pytest.approx(15 * 1e-5 + 8 * 8 * 1e9 / 10e9)
    shared = Cluster(4, 4, 1e9 / 8, 1e9 / 8, 0, 0, "shared")
    assert shared.allreduce(4 * 2 ** 24) == pytest.approx(4 * 1.5 * 4 * 2 ** 24 / (1e9 / 8))


# ---- the timing model against the recorded benchmarks -------------------------

def test_recorded_benchmarks_are_predicted_within_15_percent():
    """The step times docs/ recorded for make bench's set-ups on the emulated
    1 Gbit/s link, against the planner with a profile calibrated on that
    machine (plan_profile_2core.json: --calibrate --threads 1, nothing else
    running): every set-up within 15%, the CPU-bound ones (compression and
    codecs of 4 ranks on 2 cores) included, except the 1M-float 1-bit
    allreduce (docs/guides/planner.md "Accuracy" says why)."""
    from dsopt.plan import benchmarks
    from dsopt.plan.profile import load

    rows = benchmarks.predict_all(load(conftest.HERE / "plan_profile_2core.json", required=True))
    assert len([r for r in rows if r.link_bound]) >= 20 and len(rows) >= 34
    exempt = ("compressed_allreduce", "1-bit allreduce, 1,048,576 floats")
    bad = [f"{r.bench} {r.setup}: predicted {r.predicted:.3f} s, recorded {r.recorded:.3f} s ({r.error:+.1%})"
           for r in rows if (r.bench, r.setup) != exempt and abs(r.error) > 0.15]
    assert not bad, "\n".join(bad)


def test_quiet_run_is_predicted_within_15_percent_but_the_smallest_compressed_allreduce():
    """A run of the five set-ups on the emulated link with the 2-core machine
    to itself (plan_netem_quiet.log), against the profile calibrated there:
    every set-up within 15%, CPU-bound ones included, except the 1M-float
    1-bit allreduce (one piece, 4 ranks on 2 cores: docs/guides/planner.md
    "Accuracy" says why)."""
    from dsopt.plan import benchmarks
    from dsopt.plan.profile import load

    log = (conftest.HERE / "plan_netem_quiet.log").read_text()
    rows = benchmarks.measured_rows(log, load(conftest.HERE / "plan_profile_2core.json", required=True))
    assert len(rows) == 34
    exempt = ("compressed_allreduce", "1-bit allreduce, 1,048,576 floats")
    assert any((r.bench, r.setup) == exempt for r in rows)
    bad = [f"{r.bench} {r.setup}: predicted {r.predicted:.4f} s, measured {r.recorded:.4f} s ({r.error:+.1%})"
           for r in rows if (r.bench, r.setup) != exempt and abs(r.error) > 0.15]
    assert not bad, "\n".join(bad)


def test_zero_packing_at_once_hides_behind_the_previous_buckets_transfers():
    """dsopt_step with ZeRO's gradients at once packs bucket k + 1 while
    bucket k is reduced: every bucket's packing but the first hides behind
    the transfers, never more than they take; stage 0 and gradients handed
    over during backward are modelled as before."""
    from dsopt.plan import benchmarks, timing
    from dsopt.plan.collectives import step_calls
    from dsopt.plan.profile import Profile

    prof, link, n = Profile(), benchmarks.LINK, 2 ** 24
    model = Model((n,))
    for buckets in (1, 4, 16):
        s = Settings(reduce_bucket_size=n // buckets, allgather_bucket_size=n // buckets)
        for cfg in (Config("zero2"), Config("czero", "int4", "int8")):
            t = timing.step_time(cfg, model, link, s, prof, 0.0)
            pack = prof.cost("zero_pack") * n * link.cpu_oversubscription
            wire = sum(getattr(link, c.op)(c.nbytes) for c in step_calls(cfg, model, 4, s, "steady") if c.stage == "grad")
            assert t.exposed == pytest.approx(t.comm - min(pack, wire) * (buckets - 1) / buckets)
    assert pack < wire  # the uncalibrated pack is fast: it hides whole but for the first bucket
    slow = Profile(dict(prof.costs, zero_pack=1.0))  # packing far longer than the wire
    s = Settings(reduce_bucket_size=n // 4)
    t = timing.step_time(Config("zero2"), model, link, s, slow, 0.0)
    wire = sum(getattr(link, c.op)(c.nbytes) for c in step_calls(Config("zero2"), model, 4, s, "steady")
               if c.stage == "grad")
    assert t.exposed == pytest.approx(t.comm - wire * 3 / 4)
    for cfg in (Config("adamw"), Config("zero2", overlap=True)):
        t = timing.step_time(cfg, model, link, Settings(reduce_bucket_size=n // 4), prof, 1.0)
        ref = timing.step_time(cfg, model, link, Settings(reduce_bucket_size=n // 4), slow, 1.0)
        assert t.exposed == pytest.approx(ref.exposed)


def test_concurrent_calibration_averages_copies_run_at_once():
    from dsopt.plan.calibrate import calibrate_concurrent

    with pytest.raises(ValueError, match="copies must be >= 1"):
        calibrate_concurrent(0)
    lines = []
    prof = calibrate_concurrent(2, numel=2 ** 14, threads=1, log=lines.append)
    assert prof.calibrated and "2 copies at once" in prof.device and prof.numel >= 2 ** 14
    assert set(prof.costs) >= {"adamw", "zero_pack", "codec:int4/int8", "onebit_adam_compress"}
    assert all(v >= 0 for v in prof.costs.values()) and prof.cost("adamw") > 0
    # Each line gives the mean and the copies' range around it.
    import re

    adamw = next(line for line in lines if line.split()[0] == "adamw")
    mean, low, high = map(float, re.fullmatch(r"\s*adamw\s+([\d.]+) ns per element \(copies: ([\d.]+)-([\d.]+)\)",
                                              adamw).groups())
    assert low <= mean <= high and mean == pytest.approx(prof.cost("adamw") * 1e9, rel=1e-3)


def test_compressed_allreduce_is_a_pipeline_over_its_pieces():
    from dsopt.plan.timing import pipelined

    assert pipelined(3.0, 5.0, 1) == 8.0
    assert pipelined(3.0, 5.0, 4) == pytest.approx(5.0 + 3.0 / 4)
    assert pipelined(6.0, 2.0, 8) == pytest.approx(6.0 + 2.0 / 8)
    # More pieces hide more, never more than the smaller part.
    assert pipelined(3.0, 5.0, 32) < pipelined(3.0, 5.0, 4) < pipelined(3.0, 5.0, 1)


def test_cache_size_is_read_from_sysfs(tmp_path, monkeypatch):
    from dsopt.plan import calibrate

    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "307200K"), ("index9", "bad")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    monkeypatch.setattr(calibrate, "SYSFS_CACHE", str(tmp_path))
    assert calibrate.cache_bytes() == 300 << 20
    monkeypatch.setattr(calibrate, "SYSFS_CACHE", str(tmp_path / "missing"))
    assert calibrate.cache_bytes() == 0


def test_every_timed_step_starts_after_a_cache_sweep(monkeypatch):
    from dsopt.plan import calibrate

    events = []

    class Sweep:
        def __init__(self, device):
            pass

        def __call__(self):
            events.append("sweep")

    monkeypatch.setattr(calibrate, "CacheSweep", Sweep)
    real_sync = calibrate._synchronize
    monkeypatch.setattr(calibrate, "_synchronize", lambda device: (events.append("sync"), real_sync(device)))
    import dsopt

    local = dsopt.Communicator.local()
    cfg = calibrate._cfg("AdamW", threads=1)
    times, _ = calibrate.time_interleaved([(cfg, local), (dict(cfg), local)], [1000, 24], steps=3, warmup=1)
    assert len(times) == 2 and all(t > 0 for t in times)
    # Per step: the sweep, then the synchronisations around the timed step.
    assert events == ["sweep", "sync", "sync"] * (2 * 4)


def test_benchmark_log_is_read_beside_the_predictions():
    """make bench's emulated.log (here: one run of the five set-ups on the
    emulated link, on the 2-core machine while other work loaded it) is read
    set-up by set-up; the link-bound ones that encode nothing within 25% of
    that run (under that load the codecs' encoding took up to twice its
    quiet time, which the quiet profile does not know)."""
    from dsopt.plan import benchmarks
    from dsopt.plan.profile import load

    log = (conftest.HERE / "plan_netem_run.log").read_text()
    rows = benchmarks.measured_rows(log, load(conftest.HERE / "plan_profile_2core.json", required=True))
    got = {(r.bench, r.setup): r.recorded for r in rows}
    assert len(rows) == 26
    assert got[("onebit_e2e", "Adam dsopt_step, 4.19M")] == 0.857
    assert got[("compressed_zero", "int4/int8, fp32")] == 2.369
    assert got[("overlap_e2e", "stage 2, backward 1 x T_c, grad_ready")] == 5.587
    plain = [r for r in rows if r.link_bound and (r.bench != "compressed_zero" or r.setup.startswith("none/none"))]
    assert len(plain) >= 18
    bad = [f"{r.bench} {r.setup}: {r.error:+.1%}" for r in plain if abs(r.error) > 0.25]
    assert not bad, bad


# ---- the algorithms come from the library ------------------------------------

def test_every_registered_algorithm_is_plannable():
    """Every type dsopt_algorithm_names lists gives rows on every path its
    description allows, at one rank and at several."""
    from dsopt.plan import Cluster, plan
    from dsopt.plan.algorithms import names
    from dsopt.plan.configs import all_configs, configs_of
    from dsopt.plan.profile import Profile

    model = Model((1001, 437, 2, 77), "bf16")
    for t in names():
        configs = configs_of(t)
        assert configs and all(c.algorithm == t for c in configs)
        for ranks in (1, 8):
            records = plan(model, Cluster.parse(ranks, min(ranks, 4)), 0.01, Profile(), Settings(steps=200),
                           configs)
            assert len(records) == len(configs)
            assert all(r.memory.total > 0 and r.average_time > 0 for r in records)
        assert {c.algorithm for c in all_configs(algorithms=[t.lower()])} == {t}
    assert {"Lion", "Lamb", "AdamW", "OneBitAdam"} <= set(names())


def test_default_table_has_each_algorithm_once():
    from dsopt.plan.algorithms import describe, names, same_but_name
    from dsopt.plan.configs import all_configs

    shown = {c.algorithm for c in all_configs()}
    # A type alike to an earlier one but for its name (Adam: AdamW) is left out.
    assert "Adam" not in shown and "AdamW" in shown and {"Lion", "Lamb"} <= shown
    assert len({same_but_name(describe(t)) for t in names()}) == len(shown)
    assert [c.name for c in all_configs() if c.algorithm == "Lion"] == ["Lion", "Lion ZeRO-1", "Lion ZeRO-2"]


def test_one_moment_keeps_half_of_adamws_moments():
    """A moment rule keeps `moments` fp32 arrays per element (sharded under
    ZeRO): one moment (Lion, SGD) 4 bytes per element less than AdamW's two."""
    from dsopt.plan.algorithms import describe, names
    from dsopt.plan.layout import zero_layout

    one = [t for t in names() if describe(t).moments == 1]
    assert "Lion" in one
    model = Model((1001, 437, 2, 77), "bf16")
    n, s = model.numel, Settings(reduce_bucket_size=400, allgather_bucket_size=300)
    for world in (1, 3, 4):
        shard = zero_layout(n, world, 400, 300).shard
        for t in one:
            for path, per in (("replicated", n), ("zero1", shard), ("zero2", shard)):
                adamw, mine = (memory(Config(a, path=path), model, world, s) for a in ("AdamW", t))
                assert adamw.state - mine.state == 4 * per
                assert adamw.total - mine.total == 4 * per
                assert mine.state == (4 * n if path == "replicated" else adamw.state - 8 * shard) + 4 * per
            adamw, mine = (memory(Config(a, "int8", "int8", path="czero"), model, world, s) for a in ("AdamW", t))
            assert adamw.total - mine.total == 4 * shard


def test_a_moment_rule_sends_adamws_bytes():
    """The gradient path, not the update rule, sets the bytes: every moment
    rule sends AdamW's bytes on each path; LAMB under ZeRO adds its
    whole-tensor norms' allreduces."""
    from dsopt.plan.algorithms import describe, names
    from dsopt.plan.configs import configs_of

    model = Model((1001, 437, 2, 77), "fp16")
    s = Settings(reduce_bucket_size=400, allgather_bucket_size=300)
    adamw = {(c.path, c.gradients, c.parameters, c.overlap): c for c in configs_of("AdamW")}
    for t in names():
        if describe(t).compressed:
            continue
        for cfg in configs_of(t):
            ref = adamw[(cfg.path, cfg.gradients, cfg.parameters, cfg.overlap)]
            for world in (2, 4):
                got, want = (pbytes.step_bytes(c, model, world, s).steady for c in (cfg, ref))
                if describe(t).trust_ratio and cfg.zero:
                    assert got == want + pbytes.sums_exchange(cfg, model, world, s) and got > want
                else:
                    assert got == want, (cfg.name, world)


def test_configurations_read_the_description():
    from dsopt.plan.configs import by_name

    assert Config("zoadam") == Config("ZeroOneAdam") and Config("zero2").algorithm == "AdamW"
    assert Config("lion", path="zero2").name == "Lion ZeRO-2"
    assert Config("Lamb", "int4", "int8", True, "czero").name == "LAMB ZeRO-2 int4/int8 +overlap"
    assert by_name("lion zero-2 sign/bf16") == Config("Lion", "sign", "bf16", path="czero")
    with pytest.raises(ValueError, match="ZeRO"):
        Config("OneBitAdam", path="zero2")
    with pytest.raises(ValueError, match="unknown algorithm"):
        Config("Adagrad")
    cfg = Config("OneBitLamb").dsopt_config(Model((10,)), Settings(freeze_step=7))
    assert cfg["optimizer"] == {"type": "OneBitLamb", "params": {"lr": 1e-3, "freeze_step": 7}}


def test_command_shows_the_algorithms_asked_for(tmp_path):
    out = run_cli("--params", "1e8", "--ranks", "16", "--ranks-per-node", "8", "--compute", "100ms",
                  "--algorithms", "lion,onebitadam", "--profile", str(tmp_path / "none.json"))
    assert out.returncode == 0, out.stderr
    rows = [line.split("  ")[0] for line in out.stdout.split("-\n", 1)[1].split("\n\n")[0].splitlines()]
    assert "Lion ZeRO-2 int4/int8 +overlap" in rows and "1-bit Adam" in rows
    assert not any(r.startswith(("AdamW", "ZeRO-", "LAMB")) for r in rows)
    choice = out.stdout.split("\nchoice: ")[1]
    assert choice.startswith(("Lion", "1-bit Adam"))
    out = run_cli("--params", "1e8", "--algorithms", "Adagrad", "--profile", str(tmp_path / "none.json"))
    assert out.returncode == 2 and "unknown algorithm" in out.stderr


# ---- the node-aware forms (docs/guides/multi-node.md) -----------------------

def _simulate_car_bytes(sizes, N, R, onebit_node=False):
    """An independent count of the node-aware 1-bit allreduce's bytes: walk
    every message of the exchange rank by rank and add what crosses a node
    boundary and what stays inside (per rank, rank 0's). `onebit_node`:
    the 1-bit node step on several nodes, whose first half of a 1-bit
    allreduce over the node sends each local rank its chunk of signs and
    the worker scale instead of the fp32 slice."""
    from math import gcd
    P = N * R

    def padded(n, world):
        unit = world * (8 * world // gcd(world, 8))
        return -(-n // unit) * unit

    node_of = lambda r: r // R                         # noqa: E731
    cross = inside = 0
    me = 0
    onebit = onebit_node and N > 1 and R > 1
    for n in sizes:
        m = padded(n, R) // R if onebit else -(-n // R) if R > 1 else n
        if R > 1:
            for dst in range(P):                        # reduce-scatter: my slice i to local rank i
                if dst != me and node_of(dst) == node_of(me):   # (1-bit: chunk i's signs, my scale)
                    inside += m // 8 + 4 if onebit else 4 * m
            for dst in range(P):                        # allgather to every local rank: my rail's
                if dst != me and node_of(dst) == node_of(me):   # result (N chunks of signs, N scales),
                    inside += N * (padded(m, N) // N // 8) + 4 * N if N > 1 else 4 * m  # or my fp32 slice
        if N > 1:
            chunk_bits = padded(m, N) // N               # the rail's all-to-all block and gathered chunk
            for dst in range(P):
                if dst % R == me % R and dst != me:     # my rail, other nodes
                    cross += 2 * (chunk_bits // 8) + 2 * 4   # block + server chunk, two fp32 scales
    return inside, cross


def _simulate_zero_bytes(numel, N, R, settings, gradients, parameters):
    """An independent count of compressed ZeRO's node-aware exchange (rank
    0): every bucket's node-slice reduce-scatter and rail all-to-all, every
    chunk's allgather across nodes then inside, message by message."""
    from dsopt.plan import codecs
    P = N * R
    unit = 2 * P
    padded = -(-numel // unit) * unit
    bucket = min(max(unit, settings.reduce_bucket_size // unit * unit), padded)
    buckets, at = [], 0
    while at < padded:
        buckets.append(min(bucket, padded - at))
        at += bucket
    shard = padded // P
    chunk = min(shard, max(1, settings.allgather_bucket_size // P))
    if parameters == "int8":
        chunk = min(shard, max(settings.parameter_block_size,
                               max(1, settings.allgather_bucket_size // P) // settings.parameter_block_size
                               * settings.parameter_block_size))
    chunks, at = [], 0
    while at < shard:
        chunks.append(min(chunk, shard - at))
        at += chunk
    me, node_of, local_of = 0, (lambda r: r // R), (lambda r: r % R)
    total = cross = 0
    for b in buckets:
        m = b // P
        code = codecs.gradient_piece_bytes(gradients, settings.gradient_block_size, m)
        for dst in range(P):
            if dst == me:
                continue
            if node_of(dst) == node_of(me):            # fp32 node-slice of dst: the pieces of its rail
                total += 4 * sum(m for owner in range(P) if local_of(owner) == local_of(dst))
            elif local_of(dst) == local_of(me):        # codes of dst's piece of my node-slice
                total += code
                cross += code
    for c in chunks:
        code = codecs.parameter_chunk_bytes(parameters, settings.parameter_block_size, c, 4)
        for dst in range(P):
            if dst != me and node_of(dst) != node_of(me) and local_of(dst) == local_of(me):
                total += code                           # my codes across nodes, on my rail
                cross += code
        for dst in range(P):
            if dst != me and node_of(dst) == node_of(me):
                total += N * code                       # my rail's N codes to my node's ranks
    return total, cross


@pytest.mark.parametrize("N,R", [(2, 2), (2, 3), (3, 2)])
def test_node_aware_onebit_bytes_equal_a_simulated_exchange(N, R):
    from dsopt.plan.bytes import car_node_aware
    from dsopt.plan.network import Topology
    for sizes in ([1], [1000], [4097, 5, 123457], [8 << 20, 131072]):
        assert car_node_aware(sizes, Topology(N, R, True)) == _simulate_car_bytes(sizes, N, R), sizes


@pytest.mark.parametrize("N,R", [(2, 2), (2, 3), (3, 2), (1, 4), (4, 1)])
def test_onebit_node_step_bytes_equal_a_simulated_exchange_and_the_reference(N, R):
    """The 1-bit node step (topology.node_reduce "1bit"): the planner's
    bytes against the message-by-message count and against
    node_aware_reference.node_bytes / rail_bytes; on one node or at one
    rank per node it is the fp32 form."""
    import node_aware_reference as ref
    from dsopt.plan.bytes import car_node_aware
    from dsopt.plan.network import Cluster, Topology
    topo = Cluster.parse(N * R, R, hierarchy="node_aware", node_reduce="1bit").topo
    assert topo == Topology(N, R, True, N > 1 and R > 1)
    for sizes in ([1], [1000], [4097, 5, 123457], [8 << 20, 131072], [1_048_579]):
        got = car_node_aware(sizes, topo)
        assert got == _simulate_car_bytes(sizes, N, R, onebit_node=True), sizes
        assert got == (ref.node_bytes(sizes, N, R, True), ref.rail_bytes(sizes, N, R, True)), sizes
        if N == 1 or R == 1:
            assert got == car_node_aware(sizes, Topology(N, R, True)), sizes
    if N > 1 and R > 1:  # signs instead of fp32 inside the node; about as much across
        sizes = [8 << 20, 131072]
        fp32 = car_node_aware(sizes, Topology(N, R, True))
        onebit = car_node_aware(sizes, topo)
        assert onebit[0] < fp32[0] / 4 and abs(onebit[1] - fp32[1]) < 0.01 * fp32[1]


@pytest.mark.parametrize("N,R", [(2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("gradients,parameters", [("int4", "int8"), ("int8", "bf16"), ("sign", "int8")])
def test_node_aware_zero_bytes_equal_a_simulated_exchange(N, R, gradients, parameters):
    from dsopt.plan.bytes import zero_exchange_bytes
    from dsopt.plan.network import Topology
    for numel, bucket, ag in ((1_000_003, 1 << 18, 1 << 18), (4096, 500_000_000, 500_000_000), (77_777, 999, 5000)):
        s = Settings(reduce_bucket_size=bucket, allgather_bucket_size=ag)
        model = Model.from_sizes([numel])
        got = zero_exchange_bytes(model, Topology(N, R, True), s, gradients, parameters)
        assert got == _simulate_zero_bytes(numel, N, R, s, gradients, parameters), (numel, bucket, ag)


def test_node_aware_at_one_rank_per_node_is_the_flat_form():
    from dsopt.plan import Cluster, plan
    from dsopt.plan.bytes import car_flat_cross, car_node_aware, zero_exchange_bytes
    from dsopt.plan.network import Topology
    from dsopt.plan.profile import Profile
    for P in (2, 3, 4, 6):
        sizes = [4097, 5, 123457]
        node, rail = car_node_aware(sizes, Topology(P, 1, True))
        assert node == 0 and rail == pbytes.compressed_allreduce(sizes, P) == car_flat_cross(sizes, Topology(P, 1))
        model = Model.from_sizes([1_000_003])
        for g, w in (("int4", "int8"), ("sign", "bf16"), ("none", "int8"), ("int8", "none")):
            s = Settings(reduce_bucket_size=1 << 18, allgather_bucket_size=1 << 18)
            assert (zero_exchange_bytes(model, Topology(P, 1, True), s, g, w)
                    == zero_exchange_bytes(model, Topology(P, 1, False), s, g, w))
    model = Model.from_params(50e6, tensors=7)
    for cfgs in (None,):
        a = plan(model, Cluster.parse(8, 1, inter="10gbit", hierarchy="node_aware"), 0.1, Profile(), configs=cfgs)
        b = plan(model, Cluster.parse(8, 1, inter="10gbit", hierarchy="flat"), 0.1, Profile(), configs=cfgs)
        for x, y in zip(a, b):
            assert (x.bytes, x.cross_bytes, x.time, x.average_time) == (y.bytes, y.cross_bytes, y.time, y.average_time)


def test_flat_hierarchy_keeps_the_flat_outputs():
    """hierarchy "flat" gives what the planner gave before it knew the
    node-aware form: the same bytes, calls and times as with no topology."""
    from dsopt.plan import Cluster, plan
    from dsopt.plan.collectives import step_calls
    from dsopt.plan.configs import all_configs
    from dsopt.plan.profile import Profile
    model = Model.from_params(200e6, tensors=9)
    s = Settings()
    cluster = Cluster.parse(32, 8, inter="25gbit", hierarchy="flat")
    assert not cluster.node_aware and "node-aware" not in cluster.describe()
    for cfg in all_configs():
        assert pbytes.step_bytes(cfg, model, 32, s, cluster.topo) == pbytes.step_bytes(cfg, model, 32, s)
        for kind in pbytes.phase_kinds(cfg):
            assert step_calls(cfg, model, 32, s, kind, cluster.topo) == step_calls(cfg, model, 32, s, kind)
    recs = plan(model, cluster, 0.2, Profile())
    assert all(r.cross_bytes.steady <= r.bytes.steady for r in recs)


def test_auto_is_node_aware_on_several_nodes_of_several_ranks():
    from dsopt.plan import Cluster
    assert Cluster.parse(64, 8).node_aware
    assert not Cluster.parse(64, 1).node_aware
    assert not Cluster.parse(8, 8).node_aware
    assert not Cluster.parse(64, 8, hierarchy="flat").node_aware
    with pytest.raises(ValueError, match="hierarchy"):
        Cluster.parse(8, 2, hierarchy="tree")


def test_node_aware_cuts_the_cross_node_bytes_about_r_times():
    from dsopt.plan import Cluster, plan
    from dsopt.plan.configs import Config
    from dsopt.plan.profile import Profile
    model = Model.from_params(1.3e9)
    cfgs = [Config("OneBitAdam"), Config("czero", "int4", "int8")]
    flat = plan(model, Cluster.parse(64, 8, hierarchy="flat"), 0.3, Profile(), configs=cfgs)
    aware = plan(model, Cluster.parse(64, 8, hierarchy="node_aware"), 0.3, Profile(), configs=cfgs)
    assert 7.5 < flat[0].cross_bytes.compressed / aware[0].cross_bytes.compressed < 8.5
    assert 7.5 < flat[1].cross_bytes.steady / aware[1].cross_bytes.steady < 8.5


def test_node_reduce_1bit_changes_only_the_onebit_family(tmp_path, capsys):
    """node_reduce "1bit" (--node-reduce): the 1-bit family's rows send
    signs inside the node, about the same across, hold the node worker
    errors in their state (as long as the flat form's) and compress every
    element once more; every other row, and "fp32", as before."""
    from dsopt.plan import Cluster, plan
    from dsopt.plan.__main__ import main
    from dsopt.plan.profile import Profile
    model = Model.from_params(1.3e9)
    base = plan(model, Cluster.parse(64, 8), 0.3, Profile())
    assert plan(model, Cluster.parse(64, 8, node_reduce="fp32"), 0.3, Profile()) == base
    flat = plan(model, Cluster.parse(64, 8, hierarchy="flat"), 0.3, Profile())
    onebit = plan(model, Cluster.parse(64, 8, node_reduce="1bit"), 0.3, Profile())
    assert {r.name for r in base if r.config.onebit} == {"1-bit Adam", "1-bit LAMB", "0/1 Adam"}
    for fp32, one, fl in zip(base, onebit, flat):
        if not fp32.config.onebit:
            assert one == fp32
            continue
        assert one.bytes.compressed < fp32.bytes.compressed / 4
        assert abs(one.cross_bytes.compressed - fp32.cross_bytes.compressed) < 0.01 * fp32.cross_bytes.compressed
        assert one.bytes.warmup == fp32.bytes.warmup
        assert fl.memory.state < one.memory.state and fp32.memory.state < one.memory.state
        assert one.memory.total > fp32.memory.total  # the node allreduce's errors and buffers
        assert one.phase_times["compressed"].compression > fp32.phase_times["compressed"].compression
    # One node: the fp32 form (nothing is compressed inside a node).
    assert (plan(model, Cluster.parse(8, 8, hierarchy="node_aware", node_reduce="1bit"), 0.3, Profile())
            == plan(model, Cluster.parse(8, 8, hierarchy="node_aware"), 0.3, Profile()))
    with pytest.raises(ValueError, match="node reduce"):
        Cluster.parse(8, 2, node_reduce="int8")
    args = ["--params", "1.3e9", "--ranks", "64", "--ranks-per-node", "8", "--compute", "300ms",
            "--profile", str(tmp_path / "none.json")]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main(args + ["--node-reduce", "1bit"]) == 0
    out = capsys.readouterr().out
    assert "1-bit codes" in out and "1-bit codes" not in plain

    def row(text, name):
        return next(line.split() for line in text.splitlines() if line.startswith(name + "  "))
    assert row(out, "1-bit Adam") != row(plain, "1-bit Adam") and row(out, "AdamW") == row(plain, "AdamW")
    bad = run_cli(*args, "--node-reduce", "int8")
    assert bad.returncode == 2 and "node-reduce" in bad.stderr
