"""1-bit LAMB (docs/optimizers/onebit-lamb.md "1-bit LAMB") on 1, 2 and 4 ranks against the numpy
reference of onebit_lamb_reference.py: parameters, m (the fused buffer and
its padding tail), v, vf, the per-tensor coefficients and every rank's
compression errors bit for bit, across the transition; resuming from blobs
in every stage (bit-identical) and at another world size (errors and tail
reset). Scenarios named stable_* run the default stabilized rule, the
others DeepSpeed's ("stabilize": false).

Multi-rank runs are ``mpirun`` of mpi_lamb.py: 2 ranks, then 4 ranks that
also load the 2-rank blobs. One-rank runs happen in this process."""

import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

import dsopt
import lamb_runs
import mpi_runner
import onebit_runs as runs
from dsopt_testing import build_feature
from onebit_reference import padded_length

SCRIPT = Path(__file__).with_name("mpi_lamb.py")
WORLDS = [1, 2, 4]


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("lamb_P1")
    comm = dsopt.Communicator.local()
    for sc in lamb_runs.SCENARIOS:
        save_after = lamb_runs.SAVE_AFTER if sc.name in lamb_runs.RESUME else ()
        params, infos, blob, saved = runs.run_dsopt(sc, comm, 0, 1, save_after=save_after)
        runs.save_npz(out / f"{sc.name}_r0.npz", params, infos, blob=blob)
        for s, (b, p) in saved.items():
            params, infos, loaded, final = runs.resume_run(sc, comm, 0, b, p, s)
            runs.save_npz(out / f"{sc.name}_resume{s}_r0.npz", params, infos, loaded=loaded, blob=final)
    comm.close()
    return out


@pytest.fixture(scope="module")
def mpi_dirs(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    d2 = mpi_runner.mpirun(SCRIPT, 2, tmp_path_factory.mktemp("lamb_P2"), ["scenarios", "resume"])
    d4 = mpi_runner.mpirun(SCRIPT, 4, tmp_path_factory.mktemp("lamb_P4"), ["scenarios", "resume", "load"],
                           dict(DSOPT_ONEBIT_LOAD_FROM=str(d2), DSOPT_ONEBIT_LOAD_WORLD="2"))
    return {2: d2, 4: d4}


@pytest.fixture
def results(request):
    def get(world):
        return request.getfixturevalue("local_dir") if world == 1 else request.getfixturevalue("mpi_dirs")[world]
    return get


@functools.lru_cache(maxsize=None)
def scenario_reference(name, world):
    return lamb_runs.run_reference(lamb_runs.BY_NAME[name], world)


def raw(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_bits(actual, expected, what):
    a, e = raw(np.asarray(actual)), raw(np.asarray(expected))
    assert a.shape == e.shape and a.dtype == e.dtype, f"{what}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a.ravel() != e.ravel())
        i = bad[0]
        raise AssertionError(f"{what}: {bad.size} of {a.size} differ; first at {i}: "
                             f"{np.asarray(actual).ravel()[i]!r} vs {np.asarray(expected).ravel()[i]!r}")


def check_state(blob_bytes, ref, rank, at):
    got = lamb_runs.blob_state(runs.parse_blob(blob_bytes))
    want = lamb_runs.reference_blob_state(ref, rank)
    assert got["stage"] == want["stage"], f"{at}: stage {got['stage']} vs {want['stage']}"
    for key in ("m", "v", "vf", "coeffs", "tail", "ew", "es"):
        assert_same_bits(got[key], want[key], f"{at}: {key}")


def check_run(sc, world, folder, prefix, ref, ref_infos):
    for r in range(world):
        params, infos, blobs = runs.load_npz(folder / f"{prefix}_r{r}.npz", len(sc.sizes))
        at = f"{prefix}, P={world}, rank {r}"
        assert [bool(x) for x in infos[:, 1]] == [i["compressed"] for i in ref_infos], f"{at}: info.compressed"
        assert [bool(x) for x in infos[:, 0]] == [i["skipped"] for i in ref_infos], f"{at}: info.skipped"
        assert [int(x) for x in infos[:, 2]] == [i["step"] for i in ref_infos], f"{at}: info.step"
        for i, (p, e) in enumerate(zip(params, ref.params())):
            assert_same_bits(p, e, f"{at}: param {i} ({sc.kinds[i]}, numel {sc.sizes[i]})")
        check_state(blobs["blob"], ref, r, at)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("name", [s.name for s in lamb_runs.SCENARIOS])
def test_matches_the_reference_bit_for_bit(name, world, results):
    """Warmup trust ratios and their EMA, the transition, the fused
    compressed momentum with its tail, vf and the factor clamps: parameters
    and state equal the reference's bits on every rank."""
    sc = lamb_runs.BY_NAME[name]
    ref, ref_infos = scenario_reference(name, world)
    assert any(i["compressed"] for i in ref_infos) and not ref_infos[0]["compressed"]
    assert any(i["skipped"] for i in ref_infos) == bool(sc.poison)
    check_run(sc, world, results(world), name, ref, ref_infos)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
@pytest.mark.parametrize("save_after", lamb_runs.SAVE_AFTER, ids=lambda s: f"after{s}")
@pytest.mark.parametrize("name", lamb_runs.RESUME)
def test_resume_at_the_same_world_size_is_bit_identical(name, save_after, world, results):
    """A blob saved in warmup, at the transition or in compression, loaded
    into a fresh optimizer: the continued run ends with the same parameters
    and the same blob as the run that never stopped."""
    sc = lamb_runs.BY_NAME[name]
    folder = results(world)
    for r in range(world):
        whole_params, _, whole = runs.load_npz(folder / f"{name}_r{r}.npz", len(sc.sizes))
        params, _, resumed = runs.load_npz(folder / f"{name}_resume{save_after}_r{r}.npz", len(sc.sizes))
        for i, (a, b) in enumerate(zip(params, whole_params)):
            assert_same_bits(a, b, f"P={world} rank {r}: param {i}")
        assert resumed["blob"] == whole["blob"], f"P={world} rank {r}: final blobs differ"


def test_load_at_another_world_size_resets_errors_and_tail(results):
    """K2: 4 ranks load the 2-rank blobs after 6 updates (compression):
    m, v, vf, coefficients and stage carry over; errors and the padding
    tail start at zero at the new world size."""
    sc = lamb_runs.BY_NAME[lamb_runs.RESUME[0]]
    ref, _ = lamb_runs.run_reference(sc, 2, steps=6)
    ref.change_world(4)
    ref, ref_infos = lamb_runs.run_reference(sc, 4, ref=ref, start=6)
    folder = results(4)
    for r in range(4):
        params, infos, blobs = runs.load_npz(folder / f"load_r{r}.npz", len(sc.sizes))
        loaded = lamb_runs.blob_state(runs.parse_blob(blobs["loaded"]))
        assert loaded["stage"][3] == 4 and not np.any(loaded["ew"]) and not np.any(loaded["tail"])
        assert [bool(x) for x in infos[:, 1]] == [True] * len(ref_infos)
        for i, (p, e) in enumerate(zip(params, ref.params())):
            assert_same_bits(p, e, f"rank {r}: param {i}")
        check_state(blobs["blob"], ref, r, f"load, rank {r}")


@pytest.mark.parametrize("world", [2, 4], ids=lambda w: f"P{w}")
def test_padding_tail_persists_and_takes_part_in_compression(world):
    """L4: the tail of the fused buffer receives decompressed values and
    keeps them (the reference compresses it as is); the 5 parameters travel
    as one tensor of n' = padded(total) elements."""
    ref, _ = scenario_reference("plain", world)
    total = sum(lamb_runs.SIZES)
    assert ref.padded == padded_length(total, world) and ref.padded > total
    assert np.any(ref.tail != 0), "the tail never received a value"


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"P{w}")
def test_bytes_sent_per_stage(world, results):
    """Every step: the 16-byte handshake allreduce (the first 3 updates also
    the gradients' hash comparison, as large). Warmup: the fp32 gradient
    allreduce with the status float. Compression: one CAR of the fused
    buffer, (P-1)/P n'/4 + 8(P-1) bytes (one tensor whatever the parameter
    count), plus the 16-byte control allreduce."""
    sc = lamb_runs.BY_NAME["plain"]
    _, infos, _ = runs.load_npz(results(world) / "plain_r0.npz", len(sc.sizes))
    P = world
    handshake = runs.handshake_bytes(P)
    warm = handshake + 2 * (P - 1) * 4 * (sum(sc.sizes) + 1) // P
    comp = 0 if P == 1 else handshake + 2 * (P - 1) * 16 // P + \
        (P - 1) * padded_length(sum(sc.sizes), P) // (4 * P) + 8 * (P - 1)
    assert [int(b) for b in infos[:, 3]] == [
        (comp if compressed else warm) + runs.replication_check_bytes(P, int(step), bool(skipped))
        for skipped, compressed, step in infos[:, :3]]


def test_mask_keeps_masked_momentum_at_zero(results):
    sc = lamb_runs.BY_NAME["mask"]
    offsets = np.cumsum([0] + sc.sizes)
    for world in WORLDS:
        _, _, blobs = runs.load_npz(results(world) / "mask_r0.npz", len(sc.sizes))
        m = lamb_runs.blob_state(runs.parse_blob(blobs["blob"]))["m"]
        for i, kind in sc.masks.items():
            mask = runs.make_mask(kind, sc.sizes[i])
            assert np.all(m[offsets[i]:offsets[i + 1]][mask == 0] == 0), f"P={world}: param {i}"


def test_factor_clamps_are_active():
    """The factor_clamps scenario reaches both the threshold and the range
    clamps, so the bit-for-bit test covers them."""
    ref, _ = scenario_reference("factor_clamps", 2)
    assert all(0.98 <= f <= 1.05 for f in ref.last_factor)
    assert any(f != 1.0 for f in ref.last_factor)


def test_stabilized_rule_never_moves_coordinates_without_warmup_gradient():
    """stable_plain: parameter 0's first coordinates had no gradient in
    warmup (v = 0); the stabilized rule never moves them in compression."""
    sc = lamb_runs.BY_NAME["stable_plain"]
    ref, _ = scenario_reference("stable_plain", 2)
    start = runs.initial_params(sc)[0][:runs.COLD]
    assert np.array_equal(ref.master[0][:runs.COLD], start)
