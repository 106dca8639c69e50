"""1-bit Adam (docs/optimizers/onebit-adam.md "1-bit Adam") on 1, 2 and 4 ranks against the numpy
reference of onebit_reference.py: parameters, moments and compression errors
bit for bit, the stage of every step, the bytes sent, resuming from blobs
(same and other world size, other freeze_step), and a small training run
that ends where Adam ends. Scenarios named stable_* run the default,
stabilized compression stage; the others DeepSpeed's ("stabilize": false).

The multi-rank runs are ``mpirun`` of mpi_onebit.py: 2 ranks, then 4 ranks
(which also load the 2-rank blobs and train), then 2 ranks loading the
4-rank blobs. One-rank runs happen in this process."""

import copy
import dataclasses
import functools
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

import dsopt
import mpi_runner
import onebit_convergence
import onebit_runs as runs
from dsopt_testing import build_feature
from onebit_reference import F32, fma32, groups_from_config, padded_length

SCRIPT = Path(__file__).with_name("mpi_onebit.py")
WORLDS = [1, 2, 4]


# ---- running ----------------------------------------------------------------------


def mpirun(world, results: Path, phases, load_from=None, load_world=None, load_p1_from=None):
    env = {}
    if load_from is not None:
        env.update(DSOPT_ONEBIT_LOAD_FROM=str(load_from), DSOPT_ONEBIT_LOAD_WORLD=str(load_world))
    if load_p1_from is not None:
        env.update(DSOPT_ONEBIT_LOAD_P1_FROM=str(load_p1_from))
    return mpi_runner.mpirun(SCRIPT, world, results, phases, env)


@pytest.fixture(scope="module")
def mpi_dirs(tmp_path_factory, local_dir):
    """{2: dir, 4: dir, "4to2": dir}: the result folders of the three mpiruns
    (the last one also loads the one-rank blob)."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    d2 = mpirun(2, tmp_path_factory.mktemp("onebit_P2"), ["scenarios", "resume"])
    d4 = mpirun(4, tmp_path_factory.mktemp("onebit_P4"), ["scenarios", "resume", "load", "convergence"],
                load_from=d2, load_world=2)
    d42 = mpirun(2, tmp_path_factory.mktemp("onebit_P4to2"), ["load", "load_p1"], load_from=d4, load_world=4,
                 load_p1_from=local_dir)
    return {2: d2, 4: d4, "4to2": d42}


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    """The same scenarios and resumes on one rank, in this process."""
    out = tmp_path_factory.mktemp("onebit_P1")
    comm = dsopt.Communicator.local()
    for sc in runs.SCENARIOS:
        save_after = runs.SAVE_AFTER if sc.name in runs.RESUME else ()
        params, infos, blob, saved = runs.run_dsopt(sc, comm, 0, 1, save_after=save_after)
        runs.save_npz(out / f"{sc.name}_r0.npz", params, infos, blob=blob)
        for s, (b, p) in saved.items():
            runs.save_npz(out / f"{sc.name}_saved{s}_r0.npz", p, [], blob=b)
            params, infos, loaded, final = runs.resume_run(sc, comm, 0, b, p, s)
            runs.save_npz(out / f"{sc.name}_resume{s}_r0.npz", params, infos, loaded=loaded, blob=final)
    comm.close()
    return out


@pytest.fixture
def results(request):
    """results(world) -> folder with that world size's files."""
    def get(world):
        if world == 1:
            return request.getfixturevalue("local_dir")
        return request.getfixturevalue("mpi_dirs")[world]
    return get


# ---- comparisons -------------------------------------------------------------------


def raw(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def assert_same_bits(actual, expected, what):
    a, e = raw(np.asarray(actual)), raw(np.asarray(expected))
    assert a.shape == e.shape and a.dtype == e.dtype, f"{what}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a != e)
        i = bad[0]
        raise AssertionError(f"{what}: {bad.size} of {a.size} differ; first at {i}: "
                             f"{np.asarray(actual).ravel()[i]!r} vs {np.asarray(expected).ravel()[i]!r}")


def run_reference(sc, world, steps=None, ref=None, start=0):
    """Steps the reference with every rank's gradients; returns (ref, infos)."""
    ref = ref or runs.reference_for(sc, world)
    infos = [ref.step([runs.grads_for(sc, k, r, world) for r in range(world)])
             for k in range(start, sc.steps if steps is None else steps)]
    return ref, infos


@functools.lru_cache(maxsize=None)
def scenario_reference(name, world):
    """run_reference of a whole scenario, shared by the tests that only read it."""
    return run_reference(runs.BY_NAME[name], world)


def check_against_reference(sc, world, folder, ref, ref_infos, prefix, *, ranks=None):
    for r in range(world if ranks is None else ranks):
        params, infos, blobs = runs.load_npz(folder / f"{prefix}_r{r}.npz", len(sc.sizes))
        at = f"{prefix}, P={world}, rank {r}"
        assert [bool(x) for x in infos[:, 1]] == [i["compressed"] for i in ref_infos], f"{at}: info.compressed"
        assert [int(x) for x in infos[:, 2]] == [i["step"] for i in ref_infos], f"{at}: info.step"
        assert [bool(x) for x in infos[:, 0]] == [i["skipped"] for i in ref_infos], f"{at}: info.skipped"
        norms = [i["grad_norm"] for i in ref_infos]
        np.testing.assert_allclose(infos[:, 4], norms, rtol=1e-12, err_msg=f"{at}: info.grad_norm")
        for i, (p, e) in enumerate(zip(params, ref.params())):
            assert_same_bits(p, e, f"{at}: param {i} ({sc.kinds[i]}, numel {sc.sizes[i]})")
        blob = runs.parse_blob(blobs["blob"])
        m, v, ew, es = runs.reference_state(ref, r)
        assert_same_bits(blob.floats("onebit.exp_avg"), m, f"{at}: exp_avg")
        assert_same_bits(blob.floats("onebit.exp_avg_sq"), v, f"{at}: exp_avg_sq")
        assert_same_bits(blob.floats("onebit.worker_error"), ew, f"{at}: worker error")
        assert_same_bits(blob.floats("onebit.server_error"), es, f"{at}: server error")
        compressing, freeze, error_world = blob.stage()
        assert compressing == int(ref.compression) and freeze == ref.freeze_step
        assert blob.frozen_after() == ref.frozen_after, f"{at}: warmup updates of the frozen v"
        assert error_world == (world if ref.compression and world > 1 else 0), f"{at}: stage {blob.stage()}"


# ---- the numbers ---------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("name", [s.name for s in runs.SCENARIOS])
def test_matches_the_reference_bit_for_bit(name, world, results):
    """Parameters, m, v and every rank's errors equal the reference's bits,
    across the warmup/compression boundary; info.compressed is 1 exactly on
    the compressed steps."""
    sc = runs.BY_NAME[name]
    ref, ref_infos = scenario_reference(name, world)
    assert any(i["compressed"] for i in ref_infos) and not ref_infos[0]["compressed"]
    assert any(i["skipped"] for i in ref_infos) == bool(sc.poison)
    check_against_reference(sc, world, results(world), ref, ref_infos, name)


def test_stage_boundary_follows_freeze_step(results):
    """freeze_step F: updates 1..F-1 are warmup, update F is the first
    compressed one; freeze_step 1 behaves as 2."""
    for name, first in (("plain", 4), ("freeze_step_1", 2), ("large", 2)):
        sc = runs.BY_NAME[name]
        for world in WORLDS:
            _, infos, _ = runs.load_npz(results(world) / f"{name}_r0.npz", len(sc.sizes))
            assert [int(x) for x in infos[:, 1]] == [int(k + 1 >= first) for k in range(sc.steps)], \
                f"{name}, P={world}"


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
def test_bytes_sent_per_stage(world, results):
    """Warmup: the fp32 gradient allreduce plus the status float,
    2(P-1)/P * 4(N+1). Compression: the CAR's (P-1)/P N'/4 + 8(P-1)T plus the
    16-byte control allreduce (status, norm), and the non_freeze groups'
    gradient allreduce. One large tensor: about 32x less."""
    for sc in runs.SCENARIOS:
        _, ref_infos = scenario_reference(sc.name, world)
        _, infos, _ = runs.load_npz(results(world) / f"{sc.name}_r0.npz", len(sc.sizes))
        expected = [runs.step_bytes(sc, world, i) for i in ref_infos]
        assert [int(b) for b in infos[:, 3]] == expected, f"{sc.name}, P={world}"
    if world > 1:
        sc = runs.BY_NAME["large"]
        ratio = runs.warmup_bytes(sc, world) / runs.compressed_bytes(sc, world)
        assert 30 < ratio < 32.1, ratio


def test_momentum_mask_keeps_masked_momentum_at_zero(results):
    sc = runs.BY_NAME["mask"]
    offsets = np.cumsum([0] + sc.sizes)
    for world in WORLDS:
        _, _, blobs = runs.load_npz(results(world) / "mask_r0.npz", len(sc.sizes))
        m = runs.parse_blob(blobs["blob"]).floats("onebit.exp_avg")
        for i, kind in sc.masks.items():
            mask = runs.make_mask(kind, sc.sizes[i])
            mi = m[offsets[i]:offsets[i + 1]]
            assert np.all(mi[mask == 0] == 0), f"P={world}: masked momentum of param {i} is not zero"
            assert np.count_nonzero(mi[mask == 1]) > 0.9 * np.count_nonzero(mask)
        # unmasked parameters keep their momentum
        assert np.count_nonzero(m[offsets[1]:offsets[2]]) == sc.sizes[1]


def test_clipping_norm_is_the_same_on_every_rank_in_both_stages(results):
    sc = runs.BY_NAME["clipping"]
    for world in WORLDS:
        ref, ref_infos = scenario_reference(sc.name, world)
        for r in range(world):
            _, infos, _ = runs.load_npz(results(world) / f"clipping_r{r}.npz", len(sc.sizes))
            norms = infos[:, 4]
            np.testing.assert_allclose(norms, [i["grad_norm"] for i in ref_infos], rtol=1e-12,
                                       err_msg=f"P={world} rank {r}")
            assert np.all(norms > 2 * sc.config["gradient_clipping"]), "clipping is not active"


def test_non_freeze_group_has_no_errors_and_keeps_updating_v(results):
    sc = runs.BY_NAME["non_freeze"]
    compressed = [n for n, g in zip(sc.sizes, sc.groups) if g == 0]
    for world in (2, 4):
        _, _, blobs = runs.load_npz(results(world) / "non_freeze_r0.npz", len(sc.sizes))
        blob = runs.parse_blob(blobs["blob"])
        assert blob.floats("onebit.worker_error").size == sum(padded_length(n, world) for n in compressed)
    ref_end, _ = run_reference(sc, 2)
    ref_freeze, _ = run_reference(sc, 2, steps=sc.config["optimizer"]["params"]["freeze_step"] - 1)
    for i, g in enumerate(sc.groups):
        same = np.array_equal(ref_end.v[i], ref_freeze.v[i])
        assert same == (g == 0), f"param {i} (group {g}): v frozen = {same}"


# ---- the stabilized compression stage ---------------------------------------------------

STABILIZED = [s.name for s in runs.SCENARIOS if s.name.startswith("stable_")]


def on_deepspeed_rule(sc):
    """The same scenario and data with DeepSpeed's rule ("stabilize" and
    "bias_correction" false)."""
    config = copy.deepcopy(sc.config)
    config["optimizer"]["params"]["stabilize"] = False
    config["optimizer"]["params"]["bias_correction"] = False
    return dataclasses.replace(sc, config=config)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
def test_stabilized_scenarios_clamp_the_applied_momentum(world):
    """The stable_* scenarios exercise the rule where its limit L matters:
    some momenta of elements with v > 0 are clamped (before compression, or
    when applied), and the result differs from DeepSpeed's rule on the same
    data."""
    for name in STABILIZED:
        sc = runs.BY_NAME[name]
        ref, _ = scenario_reference(name, world)
        deepspeed, _ = run_reference(on_deepspeed_rule(sc), world)
        assert ref.clamped > 0, f"{name}, P={world}: the clamp was never active where v > 0"
        assert any(not np.array_equal(a, b) for a, b in zip(ref.master, deepspeed.master)), f"{name}, P={world}"


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("name", ["stable_plain", "stable_weight_decay"])
def test_stabilized_rule_leaves_never_updated_coordinates_still(name, world, results):
    """A coordinate whose gradient was 0 in every warmup update has v = 0,
    hence bound 0: in the compression stage it moves only by its weight
    decay, although its stored momentum is not zero (P > 1: the compressed
    momentum is +-scale). DeepSpeed's rule moves it by lr |m| / eps."""
    sc = runs.BY_NAME[name]
    cold = slice(0, sc.cold[0])
    hp = groups_from_config(sc.config)[sc.groups[0] if sc.groups else 0]
    lr, wd = F32(hp.lr), F32(hp.weight_decay)

    def decayed(p, steps):  # m / (sqrt(v) + eps) is 0: only u = wd p is left
        for _ in range(steps):
            if wd > 0:
                p = fma32(-lr, (wd * p).astype(np.float32), p)
        return p

    start = runs.initial_params(sc)[0][cold]
    for r in range(world):
        params, _, blobs = runs.load_npz(results(world) / f"{name}_r{r}.npz", len(sc.sizes))
        blob = runs.parse_blob(blobs["blob"])
        assert_same_bits(params[0][cold], decayed(start, sc.steps), f"{name}, P={world}, rank {r}: cold coordinates")
        assert not blob.floats("onebit.exp_avg_sq")[cold].any()
        if world > 1:
            assert np.all(blob.floats("onebit.exp_avg")[cold] != 0), "the stored momentum is not clamped"
    first = runs.warmup_steps(sc) + 1
    deepspeed, _ = run_reference(on_deepspeed_rule(sc), world, steps=first)
    moved = np.abs(deepspeed.master[0][cold] - decayed(start, first - 1))
    np.testing.assert_allclose(moved, lr * np.abs(deepspeed.m[0][cold]) / F32(hp.eps), rtol=1e-3)
    assert moved.max() > 1e3


def test_stabilized_rule_leaves_non_freeze_groups_on_warmup_math(tmp_path):
    """Only compressed momenta are clamped: non_freeze groups keep the warmup
    update. A small stabilize_limit makes the clamp bind on them if it were
    applied (with limit 1 and a short warmup it cannot: Adam's |m| / sqrt(v)
    stays below L there)."""
    sc = runs.BY_NAME["stable_non_freeze"]
    sc = dataclasses.replace(sc, config=copy.deepcopy(sc.config))
    sc.config["optimizer"]["params"]["stabilize_limit"] = 0.05
    comm = dsopt.Communicator.local()
    params, infos, blob, _ = runs.run_dsopt(sc, comm, 0, 1)
    comm.close()
    runs.save_npz(tmp_path / "limit_r0.npz", params, infos, blob=blob)
    ref, ref_infos = run_reference(sc, 1)
    check_against_reference(sc, 1, tmp_path, ref, ref_infos, "limit")


# ---- resuming -------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("after", runs.SAVE_AFTER, ids=lambda s: f"after{s}")
@pytest.mark.parametrize("name", runs.RESUME)
def test_resume_at_the_same_world_size_is_bit_identical(name, after, world, results):
    """Saved after 2 updates (warmup), 3 (the transition: the next update is
    the first compressed one) and 6 (compression), loaded into a fresh
    optimizer: the continued run ends with the same parameters and the same
    blob bytes; a blob saved right after loading equals the loaded one."""
    sc = runs.BY_NAME[name]
    folder = results(world)
    for r in range(world):
        p_full, info_full, b_full = runs.load_npz(folder / f"{name}_r{r}.npz", len(sc.sizes))
        _, _, b_saved = runs.load_npz(folder / f"{name}_saved{after}_r{r}.npz", len(sc.sizes))
        p_res, info_res, b_res = runs.load_npz(folder / f"{name}_resume{after}_r{r}.npz", len(sc.sizes))
        at = f"{name} saved after {after}, P={world}, rank {r}"
        assert b_res["loaded"] == b_saved["blob"], f"{at}: blob after load differs from the loaded blob"
        for i, (a, e) in enumerate(zip(p_res, p_full)):
            assert_same_bits(a, e, f"{at}: param {i}")
        assert b_res["blob"] == b_full["blob"], f"{at}: final blobs differ"
        np.testing.assert_array_equal(info_res[:, :3], info_full[after:, :3], err_msg=at)
    if after == 3:
        blob = runs.parse_blob(b_saved["blob"])
        assert blob.stage()[0] == 1, "after update freeze_step - 1 the blob is in the compression stage"
        assert int(info_res[0, 1]) == 1


def masters_of(blob, sc):
    """fp32 value of each parameter according to a blob (16-bit ones from
    the masters section; fp32 ones are the caller's and not in the blob)."""
    masters = blob.floats("common.masters")
    out, pos = [], 0
    for n, kind in zip(sc.sizes, sc.kinds):
        if kind != "fp32":
            out.append(masters[pos:pos + n].copy())
            pos += n
        else:
            out.append(None)
    assert pos == masters.size
    return out


def reference_from_blob(sc, world, blob, params):
    """A reference continuing from a blob's state with zero errors."""
    ref = runs.reference_for(sc, world)
    m, v = blob.floats("onebit.exp_avg"), blob.floats("onebit.exp_avg_sq")
    offsets = np.cumsum([0] + sc.sizes)
    masters = masters_of(blob, sc)
    for i in range(len(sc.sizes)):
        ref.m[i] = m[offsets[i]:offsets[i + 1]].copy()
        ref.v[i] = v[offsets[i]:offsets[i + 1]].copy()
        ref.master[i] = masters[i] if masters[i] is not None else np.asarray(params[i], np.float32).copy()
    (steps,) = struct.unpack_from("<q", blob.sections["common.steps"])
    ref.updates = steps
    ref.compression = bool(blob.stage()[0])
    ref.frozen_after = blob.frozen_after()
    return ref


@pytest.mark.parametrize("src,dst", [(2, 4), (4, 2), (2, 1), (4, 1), (1, 2)], ids=lambda v: f"P{v}")
def test_load_at_another_world_size_keeps_moments_and_resets_errors(src, dst, results, mpi_dirs, tmp_path):
    """A compression-stage blob of P ranks loaded on P' ranks: m, v, steps,
    learning rates and masters as saved, compression stage, errors zero (for
    P'); the continued run equals the reference started from that state with
    zero errors."""
    sc = runs.BY_NAME[runs.RESUME[0]]
    src_dir = results(src)
    if dst == 1:
        p, _, b = runs.load_npz(src_dir / f"{sc.name}_saved6_r0.npz", len(sc.sizes))
        params, infos, loaded, final = runs.resume_run(sc, dsopt.Communicator.local(), 0, b["blob"], p, 6, 1)
        runs.save_npz(tmp_path / "load_r0.npz", params, infos, loaded=loaded, blob=final)
        folder = tmp_path
        prefix = "load"
    else:
        folder = mpi_dirs[4] if dst == 4 else mpi_dirs["4to2"]
        prefix = "load_p1" if src == 1 else "load"
    for r in range(dst):
        p_src, _, b_src = runs.load_npz(src_dir / f"{sc.name}_saved6_r{r % src}.npz", len(sc.sizes))
        saved = runs.parse_blob(b_src["blob"])
        params, infos, blobs = runs.load_npz(folder / f"{prefix}_r{r}.npz", len(sc.sizes))
        loaded = runs.parse_blob(blobs["loaded"])
        at = f"P={src} -> P={dst}, rank {r}"
        assert saved.world == src and loaded.world == dst
        for name in ("common.steps", "common.lr", "common.loss_scaler", "common.masters",
                     "onebit.exp_avg", "onebit.exp_avg_sq", "onebit.stabilize"):
            assert loaded.sections[name] == saved.sections[name], f"{at}: section {name} changed"
        assert saved.frozen_after() == runs.warmup_steps(sc)
        assert loaded.stage() == (1, 4, dst if dst > 1 else 0), f"{at}: stage {loaded.stage()}"
        ew, es = loaded.floats("onebit.worker_error"), loaded.floats("onebit.server_error")
        padded = sum(padded_length(n, dst) for n in sc.sizes) if dst > 1 else 0
        assert ew.size == padded and es.size == padded // max(dst, 1)
        assert not ew.any() and not es.any(), f"{at}: errors were not reset"
        if src > 1:
            assert np.any(saved.floats("onebit.worker_error") != 0), "the source blob had errors to reset"
        # the continued run equals a reference started from the saved state with zero errors
        ref = reference_from_blob(sc, dst, saved, p_src)
        ref_infos = [ref.step([runs.grads_for(sc, k, q, dst) for q in range(dst)]) for k in range(6, sc.steps)]
        assert [bool(x) for x in infos[:, 1]] == [i["compressed"] for i in ref_infos]
        for i, (a, e) in enumerate(zip(params, ref.params())):
            assert_same_bits(a, e, f"{at}: param {i} after continuing")


@pytest.mark.parametrize("stabilize", [False, True], ids=["deepspeed", "stabilized"])
@pytest.mark.parametrize("saved_freeze,saved_after,live_freeze,compressing,frozen_after", [
    (4, 6, 20, False, 0),  # compression blob, freeze_step raised: back to warmup (DeepSpeed's test)
    (10, 5, 4, True, 5),   # warmup blob, freeze_step lowered below its count: compression, v frozen now
    (4, 2, 3, True, 2),    # 2 updates + 1 >= 3
    (4, 2, 4, False, 0),   # same freeze_step: the persisted stage (warmup)
    (20, 2, 4, False, 0),  # 2 + 1 < 4
    (4, 3, 4, True, 3),    # same freeze_step, saved at the transition: the persisted stage
    (4, 6, 5, True, 3),    # compression blob, freeze_step changed, still compression: v frozen as saved
])
def test_blob_with_another_freeze_step_is_staged_by_the_deepspeed_rule(
        saved_freeze, saved_after, live_freeze, compressing, frozen_after, stabilize):
    """The stage by DeepSpeed's rule; the stabilized rule's K (warmup updates
    of the frozen v) is the saved one if the blob was saved in compression,
    else the update count at the load."""
    base = runs.BY_NAME["plain"]
    config = runs.onebit_config if stabilize else runs.deepspeed_config
    saved_sc = runs.Scenario("saved", config(freeze_step=saved_freeze), base.sizes, seed=base.seed)
    live_sc = runs.Scenario("live", config(freeze_step=live_freeze), base.sizes,
                            seed=base.seed, steps=saved_after + 3)
    comm = dsopt.Communicator.local()
    _, _, _, saved = runs.run_dsopt(saved_sc, comm, 0, 1, save_after=(saved_after,), steps=saved_after)
    blob, p = saved[saved_after]
    params, infos, loaded, _ = runs.resume_run(live_sc, comm, 0, blob, p, saved_after)
    comm.close()
    stage = runs.parse_blob(loaded).stage()
    assert stage[:2] == (int(compressing), live_freeze), stage
    assert runs.parse_blob(loaded).frozen_after() == frozen_after
    assert infos[0].compressed == compressing
    # and the run goes on as the reference from that state
    ref = reference_from_blob(live_sc, 1, runs.parse_blob(blob), p)
    ref.freeze_step = live_freeze
    if not compressing:
        ref.compression, ref.frozen_after = False, 0
    elif not ref.compression:  # v freezes now, after every update so far
        ref.enter_compression(saved_after)
    ref_infos = [ref.step([runs.grads_for(live_sc, k, 0)]) for k in range(saved_after, live_sc.steps)]
    assert [i.compressed for i in infos] == [i["compressed"] for i in ref_infos]
    for i, (a, e) in enumerate(zip(params, ref.params())):
        assert_same_bits(a, e, f"param {i}")


# ---- convergence ------------------------------------------------------------------------


def test_four_ranks_train_to_the_loss_of_adam(mpi_dirs):
    """Logistic regression on 4 ranks, 300 steps, 15% warmup: 1-bit Adam's
    final loss is within 2% of Adam's with the same data and schedule."""
    z = np.load(mpi_dirs[4] / "convergence_r0.npz")
    adam, onebit = z["adam"], z["onebit"]
    freeze = int(onebit_convergence.STEPS * onebit_convergence.WARMUP_FRACTION)
    assert int(z["compressed_steps"]) == onebit_convergence.STEPS - freeze + 1
    assert adam[-1] < 0.95 * adam[0] and onebit[-1] < 0.95 * onebit[0], "no training happened"
    assert abs(onebit[-1] - adam[-1]) <= 0.02 * adam[-1], f"1-bit Adam {onebit[-1]:.4f}, Adam {adam[-1]:.4f}"
    for r in range(1, 4):
        other = np.load(mpi_dirs[4] / f"convergence_r{r}.npz")
        assert np.array_equal(other["onebit"], onebit), "ranks disagree"


# ---- the binding's set_momentum_mask -------------------------------------------------------


def test_set_momentum_mask_binding_checks_and_changes_nothing():
    sc = runs.BY_NAME["plain"]
    params = runs.initial_params(sc)
    with dsopt.Optimizer(sc.config, params) as opt:
        opt.step(runs.grads_for(sc, 0, 0))
        blob = opt.state_dict()
        with pytest.raises(dsopt.InvalidArgument, match="numel"):
            opt.set_momentum_mask(0, np.ones(sc.sizes[0] + 1, np.float32))
        with pytest.raises(dsopt.InvalidArgument, match="(?i)float32|dtype"):
            opt.set_momentum_mask(0, np.ones(sc.sizes[0], np.float16))
        for index in (-1, len(sc.sizes)):
            with pytest.raises(dsopt.InvalidArgument, match="param_index"):
                opt.set_momentum_mask(index, np.ones(sc.sizes[0], np.float32))
        with pytest.raises(dsopt.InvalidArgumentType):
            opt.set_momentum_mask(0, [1.0] * sc.sizes[0])
        assert opt.state_dict() == blob
        opt.set_momentum_mask(1, np.zeros(sc.sizes[1], np.float32))
        opt.set_momentum_mask(1, None)
    with dsopt.Optimizer({"optimizer": {"type": "AdamW"}}, [np.ones(4, np.float32)]) as adam:
        with pytest.raises(dsopt.Unsupported):
            adam.set_momentum_mask(0, np.ones(4, np.float32))
