"""The planner's FSDP2 rows against real runs (docs/guides/planner.md
"FSDP2"): the small GPT under FSDP2 at 2 and 4 processes (gloo, CPU;
fsdp_plan_worker.py, one launch per world size), dsopt.torch.AdamW on the
shards, FSDP2's collectives and every codec of dsopt.torch.fsdp; at 4,
in the same launch, HSDP 2 x 2 with 1-bit Adam and 0/1 Adam across the
replicas. The planner, fed the model's FSDP modules, gives each step's
bytes (``Compression.bytes_sent``, ``StepInfo.bytes_sent``), each
module's shard, the residuals and dsopt's memory of every rank exactly."""

import json

import pytest

torch = pytest.importorskip("torch")
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:
    pytest.skip("torch without FSDP2", allow_module_level=True)

import conftest  # noqa: E402
from dsopt.plan import Model, Settings  # noqa: E402
from dsopt.plan import fsdp  # noqa: E402
from dsopt.plan.configs import Config  # noqa: E402
from dsopt.plan.fsdp_layout import local_sizes  # noqa: E402
from dsopt.plan.memory import memory  # noqa: E402
from dsopt.plan.network import flat_topology  # noqa: E402


@pytest.fixture(scope="module", params=[2, 4])
def runs(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"fsdp_plan_{world}")
    procs = conftest.start_ranks("fsdp_plan_worker.py", [out], world)
    conftest.wait_for(procs, f"fsdp_plan_worker.py at {world} ranks", timeout=300)
    return world, [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def planner_model(result):
    return Model.from_modules([(tuple(map(tuple, shapes)), reshard) for shapes, reshard in result["modules"]])


def config(pair):
    g, p = pair.split("/")
    return Config("AdamW", g, p, path="fsdp2")


def test_bytes_per_step_are_the_planners(runs):
    world, ranks = runs
    settings = Settings()
    pairs = {k: v for k, v in ranks[0].items() if k != "hsdp"}
    assert len(pairs) == 7 and ("hsdp" in ranks[0]) == (world == 4)
    for pair, run in pairs.items():
        model = planner_model(run)
        assert any(not m.reshard for m in model.modules) and len(model.modules) > 2
        cfg = config(pair)
        want = fsdp.collective_bytes(cfg, model, world, settings)
        for r in ranks:
            assert r[pair]["bytes"] == want, (pair, r[pair]["bytes"], want)
        assert [m.shard_numel(world) for m in model.modules] == run["shard_numels"]
        # The step's bytes: the collectives and dsopt's 16-byte status allreduce.
        sb = fsdp.step_pairs(cfg, model, flat_topology(world), settings)[0].steady
        assert sb == want + 2 * (world - 1) * 16 // world


def test_compressed_pairs_send_fewer_bytes(runs):
    world, ranks = runs
    plain = ranks[0]["none/none"]["bytes"]
    assert ranks[0]["int4/int8"]["bytes"] * 3.5 < plain
    assert ranks[0]["sign/int8"]["bytes"] < ranks[0]["int4/int8"]["bytes"] < ranks[0]["int8/int8"]["bytes"]


def test_memory_per_rank_is_the_planners(runs):
    world, ranks = runs
    settings = Settings()
    for pair in ("none/none", "int4/int8", "int8/bf16", "sign/none", "none/bf16"):
        cfg = config(pair)
        model = planner_model(ranks[0][pair])
        for rank, r in enumerate(ranks):
            run = r[pair]
            assert run["local"] == sum(local_sizes(model, world, rank))
            local = fsdp.local_model(cfg, model, world, rank)
            # dsopt's AdamW on the rank's shards: its two moments, 8 bytes per local element.
            own = memory(Config("AdamW"), local, 1, settings)
            assert (run["memory"], run["state"]) == (own.total, own.state) == (8 * run["local"],) * 2
        mem = fsdp.memory(cfg, model, flat_topology(world), settings)
        run = ranks[0][pair]
        residual = mem.state - run["state"]
        assert residual == run["residual_bytes"]
        assert (residual > 0) == (cfg.gradients != "none")
        assert mem.state == max(r[pair]["state"] for r in ranks) + residual


def test_hsdp_bytes_and_memory_are_the_planners(runs):
    """HSDP 2 x 2 (4 processes): FSDP2 in each shard group of 2, dsopt's
    1-bit Adam and 0/1 Adam across the 2 replicas. Every step's FSDP2 bytes
    (``Compression.bytes_sent``) and dsopt's (``StepInfo.bytes_sent``: the
    exchange across the replicas and the shard group's status, the first
    three steps' gradient check besides) are the planner's, warmup and
    compressed; dsopt's memory on every rank too."""
    from dsopt.plan.bytes import check_bytes
    from dsopt.plan.network import Topology
    world, ranks = runs
    if world != 4:
        pytest.skip("HSDP runs at 4 processes")
    topo = Topology(2, 2)  # 2 replicas ("nodes") of a shard group of 2
    flags = {"OneBitAdam": [False, True, True, True], "ZeroOneAdam": [False, False, True, True]}
    for name, kw in (("OneBitAdam", dict(freeze_step=2)), ("ZeroOneAdam", dict(var_freeze_step=2))):
        settings = Settings(steps=4, **kw)
        cfg = Config(name, path="hsdp")
        model = planner_model(ranks[0]["hsdp"][name])
        fsdp_bytes = fsdp.collective_bytes(cfg, model, 2, settings)
        sent, across = fsdp.step_pairs(cfg, model, topo, settings)
        for rank, r in enumerate(ranks):
            run = r["hsdp"][name]
            assert [s["compressed"] for s in run["steps"]] == flags[name]
            for step, s in enumerate(run["steps"], 1):
                kind = "compressed" if s["compressed"] else "warmup"
                check = check_bytes(2) if step <= 3 else 0
                assert s["fsdp"] == fsdp_bytes, (name, rank, step, s)
                assert s["dsopt"] == getattr(sent, kind) - fsdp_bytes + check, (name, rank, step, s)
                # All but the shard group's status crosses the replicas.
                assert getattr(across, kind) == getattr(sent, kind) - fsdp_bytes - fsdp.status_bytes(cfg, model, 2, 2)
            # dsopt's 1-bit optimizer on the rank's shards, across 2 replicas
            local = fsdp.local_model(cfg, model, 2, rank % 2)
            assert run["local"] == local.numel
            own = memory(Config(name), local, 2, settings)
            assert (run["memory"], run["state"]) == (own.total, own.state), (name, rank, run, own)
        mem = fsdp.memory(cfg, model, topo, settings)
        assert (mem.total, mem.state) == (ranks[0]["hsdp"][name]["memory"], ranks[0]["hsdp"][name]["state"])
