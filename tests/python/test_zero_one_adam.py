"""0/1 Adam (docs/optimizers/zero-one-adam.md "0/1 Adam") on 1, 2 and 4 ranks against the numpy
reference of zoadam_reference.py: parameters, moments, accumulators, the
parameters of the last sync, compression errors and schedules bit for bit
on every rank, through full, 1-bit, local and sync steps; the phase, the
compressed flag and the bytes of every step; resume in every phase at the
same world size (bit-identical) and at another one (the K2 rule); config
checks. Scenarios named stable_* run the default stabilized rule, the
others DeepSpeed's ("stabilize": false).

The multi-rank runs are ``mpirun`` of mpi_zoadam.py: 2 ranks, 4 ranks
(which also load rank 0's 2-rank blobs), then 2 ranks loading rank 0's
4-rank blobs."""

import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import mpi_runner
import dsopt
import zoadam_runs as runs
from dsopt_testing import build_feature
from test_onebit_adam import assert_same_bits
from zoadam_reference import COMPRESSED, FULL, LOCAL, SKIPPED, SYNC

SCRIPT = Path(__file__).with_name("mpi_zoadam.py")
WORLDS = [1, 2, 4]


def mpirun(world, results, phases, load_from=None):
    env = {} if load_from is None else {"DSOPT_ZOADAM_LOAD_FROM": str(load_from)}
    return mpi_runner.mpirun(SCRIPT, world, results, phases, env)


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoadam_P1")
    comm = dsopt.Communicator.local()
    with pytest.warns(dsopt.SkippedStepWarning):
        for sc in runs.SCENARIOS:
            save_after = runs.SAVE_AFTER if sc.name in runs.RESUME else ()
            params, infos, blob, saved = runs.run_dsopt(sc, comm, 0, 1, save_after)
            runs.save_npz(out / f"{sc.name}_r0.npz", params, infos, blob=blob)
            for s, (b, p) in saved.items():
                runs.save_npz(out / f"{sc.name}_saved{s}_r0.npz", p, [], blob=b)
                params, infos, final = runs.resume_run(sc, comm, 0, b, p, s)
                runs.save_npz(out / f"{sc.name}_resume{s}_r0.npz", params, infos, blob=final)
    comm.close()
    return out


@pytest.fixture(scope="module")
def mpi_dirs(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    d2 = mpirun(2, tmp_path_factory.mktemp("zoadam_P2"), ["scenarios", "resume"])
    d4 = mpirun(4, tmp_path_factory.mktemp("zoadam_P4"), ["scenarios", "resume", "load"], load_from=d2)
    d42 = mpirun(2, tmp_path_factory.mktemp("zoadam_P4to2"), ["load"], load_from=d4)
    return {2: d2, 4: d4, "4to2": d42}


@pytest.fixture
def results(request):
    def get(world):
        return request.getfixturevalue("local_dir") if world == 1 else request.getfixturevalue("mpi_dirs")[world]
    return get


@lru_cache(maxsize=None)
def scenario_reference(name, world):
    return runs.run_reference(runs.BY_NAME[name], world)


def check_rank(sc, world, folder, prefix, ref, ref_infos, rank):
    params, infos, blobs = runs.load_npz(folder / f"{prefix}_r{rank}.npz", len(sc.sizes))
    at = f"{prefix}, P={world}, rank {rank}"
    assert [int(x) for x in infos[:, 5]] == [i["phase"] for i in ref_infos], f"{at}: info.phase"
    assert [bool(x) for x in infos[:, 0]] == [i["skipped"] for i in ref_infos], f"{at}: info.skipped"
    assert [bool(x) for x in infos[:, 1]] == [i["phase"] in (COMPRESSED, SYNC) for i in ref_infos], \
        f"{at}: info.compressed"
    assert [int(x) for x in infos[:, 2]] == [i["step"] for i in ref_infos], f"{at}: info.step"
    np.testing.assert_allclose(infos[:, 4], [i["grad_norm"] for i in ref_infos], rtol=1e-12,
                               err_msg=f"{at}: info.grad_norm")
    assert [int(x) for x in infos[:, 3]] == [runs.step_bytes(sc, world, i) for i in ref_infos], \
        f"{at}: info.bytes_sent"
    for i, (p, e) in enumerate(zip(params, ref.params(rank))):
        assert_same_bits(p, e, f"{at}: param {i} ({sc.kinds[i]}, numel {sc.sizes[i]})")
    blob = runs.parse_blob(blobs["blob"])
    state = runs.reference_state(ref, rank)
    assert_same_bits(blob.floats("zoadam.exp_avg"), state["m"], f"{at}: exp_avg")
    assert_same_bits(blob.floats("zoadam.exp_avg_sq"), state["v"], f"{at}: exp_avg_sq")
    if "acc" in state:
        assert_same_bits(blob.floats("zoadam.accumulator"), state["acc"], f"{at}: accumulator")
        assert_same_bits(blob.floats("zoadam.anchor"), state["anchor"], f"{at}: parameters of the last sync")
    if "ew" in state:
        assert_same_bits(blob.floats("zoadam.worker_error"), state["ew"], f"{at}: worker error")
        assert_same_bits(blob.floats("zoadam.server_error"), state["es"], f"{at}: server error")
    assert runs.schedule_of(blob) == (int(ref.frozen), ref.var_interval, ref.var_counter, ref.local_interval,
                                      ref.local_counter, ref.variance_updates, world if world > 1 else 0), at


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("name", [s.name for s in runs.SCENARIOS])
def test_matches_the_reference_bit_for_bit(name, world, results):
    """Every rank's parameters and state equal the reference's bits through
    every kind of step; phase, compressed flag, norm and bytes per step."""
    sc = runs.BY_NAME[name]
    ref, ref_infos = scenario_reference(name, world)
    phases = {i["phase"] for i in ref_infos}
    assert {FULL, COMPRESSED, LOCAL, SYNC} <= phases
    assert (SKIPPED in phases) == bool(sc.poison)
    for r in range(world):
        check_rank(sc, world, results(world), name, ref, ref_infos, r)


def test_schedule_of_the_phases():
    """k = updates + 1 (G2): full steps on k = 2, 3, 4, 6, 8 (var_update_scaler
    2 doubles the interval after two variance updates), 1-bit steps between,
    phase 2 after k > var_freeze_step = 8, syncs at growing intervals capped
    by local_step_clipper = 4."""
    _, infos = scenario_reference("plain", 1)
    F, C, L, S = FULL, COMPRESSED, LOCAL, SYNC
    assert [i["phase"] for i in infos] == [F, F, F, C, F, C, F, C, S, S, S, L, L, L, S, L, L, L, S, L]


@pytest.mark.parametrize("world", [2, 4], ids=lambda w: f"P{w}")
def test_replicas_are_bit_identical_after_every_sync(world, results):
    """Between syncs the ranks' parameters differ (local steps); the sync
    rebuilds them from the parameters of the last sync, the same on every
    rank (docs/design/zero-one-adam.md section 4, "Recommended for the library")."""
    sc = runs.BY_NAME["weight_decay"]
    ref, infos = scenario_reference(sc.name, world)
    assert infos[-1]["phase"] == LOCAL
    assert not np.array_equal(ref.master[0][0], ref.master[1][0])
    ref_sync, _ = runs.run_reference(runs.Scenario(**{**vars(sc), "steps": 19}), world)
    for r in range(1, world):
        for a, b in zip(ref_sync.master[0], ref_sync.master[r]):
            assert_same_bits(a, b, f"rank {r} after the sync of update 19")


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("after", runs.SAVE_AFTER)
@pytest.mark.parametrize("name", runs.RESUME)
def test_resume_at_the_same_world_size_is_bit_identical(name, after, world, results):
    """A blob saved after `after` updates (phase 1, the phase change, phase 2
    mid-interval), loaded into a fresh optimizer: the rest of the run and
    the final blob are those of the uninterrupted run."""
    sc = runs.BY_NAME[name]
    folder = results(world)
    for r in range(world):
        p_full, i_full, b_full = runs.load_npz(folder / f"{name}_r{r}.npz", len(sc.sizes))
        p_res, i_res, b_res = runs.load_npz(folder / f"{name}_resume{after}_r{r}.npz", len(sc.sizes))
        for i, (a, b) in enumerate(zip(p_res, p_full)):
            assert_same_bits(a, b, f"{name} resumed after {after}, P={world}, rank {r}, param {i}")
        assert np.array_equal(i_res[:, [0, 1, 2, 3, 5]], i_full[after:, [0, 1, 2, 3, 5]])
        assert b_res["blob"] == b_full["blob"], f"{name} resumed after {after}: final blob differs"


@pytest.mark.parametrize("after", runs.SAVE_AFTER)
@pytest.mark.parametrize("name", runs.RESUME)
@pytest.mark.parametrize("src,dst", [(2, 4), (4, 2)], ids=["2to4", "4to2"])
def test_load_at_another_world_size_resets_accumulators_and_errors(src, dst, name, after, mpi_dirs):
    """Rank 0's blob of a `src`-rank run loaded on every rank of a `dst`-rank
    run: m, v, schedules and parameters kept; errors, the accumulator and the
    interval's learning-rate sum reset; the loaded parameters become those
    of the last sync (K2). The continued run matches the reference."""
    sc = runs.BY_NAME[name]
    ref, _ = runs.run_reference(runs.Scenario(**{**vars(sc), "steps": after}), src)
    ref = ref.restart_at(dst)
    ref, ref_infos = runs.run_reference(sc, dst, ref=ref, start=after)
    folder = mpi_dirs[4] if dst == 4 else mpi_dirs["4to2"]
    for r in range(dst):
        check_rank(sc, dst, folder, f"{name}_load{after}", ref, ref_infos, r)


def make(config, n=8, comm=None):
    params = [np.zeros(n, np.float32)]
    return dsopt.Optimizer(config, params, comm=comm), params


@pytest.mark.parametrize("params,pattern", [
    ({"max_grad_norm": 1.0}, "gradient_clipping"),
    ({"amsgrad": True}, "AMSGrad"),
    ({"freeze_step": 10}, "unknown key"),
    ({"var_freeze_stp": 10}, "unknown key"),
    ({"var_update_scaler": 0}, "var_update_scaler"),
    ({"local_step_scaler": 0}, "local_step_scaler"),
    ({"local_step_clipper": 0}, "local_step_clipper"),
    ({"var_freeze_step": -1}, "var_freeze_step"),
    ({"var_freeze_step": 1.5}, "integer"),
    ({"decoupled_sync_weight_decay": 1}, "true or false"),
    ({"stabilize": "yes"}, "true or false"),
    ({"stabilize_limit": 0}, "stabilize_limit"),
])
def test_bad_config_is_rejected(params, pattern):
    config = {"optimizer": {"type": "ZeroOneAdam", "params": params}}
    with pytest.raises(dsopt.InvalidArgument, match=pattern):
        make(config)


def test_non_freeze_groups_are_a_one_bit_adam_key():
    config = {"optimizer": {"type": "ZeroOneAdam"}, "param_groups": [{"non_freeze": True}]}
    with pytest.raises(dsopt.InvalidArgument, match="unknown key"):
        make(config)


def test_defaults_and_ignored_keys():
    """bias_correction and eps_inside_sqrt are accepted and ignored; with the
    defaults (var_freeze_step 100000, var_update_scaler 16) updates 1-16
    (k = 2..17) are full steps at interval 1, update 17 (k = 18) the first
    at interval 2, update 18 the first 1-bit step."""
    config = {"optimizer": {"type": "zerooneadam",
                            "params": {"bias_correction": True, "eps_inside_sqrt": True, "cuda_aware": False}}}
    opt, params = make(config)
    with opt:
        phases = [opt.step([np.full(8, 0.5, np.float32)]).phase for _ in range(19)]
    assert phases == [dsopt.PHASE_FULL] * 17 + [dsopt.PHASE_COMPRESSED, dsopt.PHASE_FULL]


def test_zero_learning_rate_over_a_sync_interval_keeps_the_momentum():
    """lr 0 for a whole interval: acc = 0 and lrs = 0; the sync keeps m
    (DeepSpeed's -(0 / 0) would be NaN) and the parameters stay put."""
    config = runs.zoadam_config(lr=0.0, var_freeze_step=1)
    opt, params = make(config)
    start = params[0].copy()
    with opt:
        infos = [opt.step([np.full(8, 0.25, np.float32)]) for _ in range(4)]
        assert infos[1].phase == dsopt.PHASE_SYNC
        assert np.array_equal(params[0], start)
        opt.lr = 1e-2
        opt.step([np.full(8, 0.25, np.float32)])
    assert np.all(np.isfinite(params[0])) and not np.array_equal(params[0], start)


def test_phase_of_the_other_optimizers():
    """Adam: full; 1-bit Adam: full in warmup, compressed after; skipped: 0."""
    opt, _ = make({"optimizer": {"type": "AdamW"}})
    with opt:
        assert opt.step([np.ones(8, np.float32)]).phase == dsopt.PHASE_FULL
        with pytest.warns(dsopt.SkippedStepWarning):
            assert opt.step([np.full(8, np.nan, np.float32)]).phase == dsopt.PHASE_SKIPPED
    opt, _ = make({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}})
    with opt:
        assert [opt.step([np.ones(8, np.float32)]).phase for _ in range(3)] == \
            [dsopt.PHASE_FULL, dsopt.PHASE_COMPRESSED, dsopt.PHASE_COMPRESSED]


def test_set_momentum_mask_checks_its_argument():
    opt, _ = make(runs.zoadam_config())
    with opt:
        opt.set_momentum_mask(0, np.ones(8, np.float32))
        with pytest.raises(dsopt.InvalidArgument, match="numel"):
            opt.set_momentum_mask(0, np.ones(7, np.float32))
        with pytest.raises(dsopt.InvalidArgument, match="param_index"):
            opt.set_momentum_mask(3, np.ones(8, np.float32))
        opt.set_momentum_mask(0, None)


def test_blob_of_another_algorithm_is_rejected():
    a, _ = make(runs.zoadam_config())
    b, _ = make({"optimizer": {"type": "OneBitAdam"}})
    with a, b:
        with pytest.raises(dsopt.Mismatch, match="OneBitAdam"):
            a.load_state_dict(b.state_dict())
