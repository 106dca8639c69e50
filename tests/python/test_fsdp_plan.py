"""The planner's FSDP2 rows against real runs (docs/guides/planner.md
"FSDP2"): the small GPT under FSDP2 at 2 and 4 processes (gloo, CPU;
fsdp_plan_worker.py, one launch per world size), dsopt.torch.AdamW on the
shards, FSDP2's collectives and every codec of dsopt.torch.fsdp. The
planner, fed the model's FSDP modules, gives each step's bytes
(``Compression.bytes_sent``), each module's shard, the residuals and
dsopt's memory of every rank exactly."""

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
    assert len(ranks[0]) == 7
    for pair, run in ranks[0].items():
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
