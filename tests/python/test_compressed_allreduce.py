"""The compressed allreduce (docs/optimizers/onebit-adam.md "The compressed allreduce (CAR)") against
the numpy reference in onebit_reference.py, bit for bit.

One ``mpirun -np P`` of the car_driver program (tests/internal/car_driver.cpp,
built with the library) per world size P = 1, 2, 3, 4 runs every job; the
driver records each rank's inputs, outputs, errors and the bytes each MPI
call sent, and the tests compare them here."""

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import conftest
from dsopt_testing import build_feature
from onebit_reference import CarReference, car_scale, padded_length, sign_error

# Element counts: 1, 7, 8, 1000, 1<<20, and sizes that are not multiples of 8
# or of any unit P * lcm(P, 8).
SIZES = [1, 7, 8, 1000, 1 << 20, 13, 100, 4097, 33, 65]
CALLS = 3
SEED = 11
# Hand-made signs for the bit order: [+,-,-,-,-,-,-,+] is the byte 0x81.
BIT_ORDER_SIGNS = np.array([1, -1, -1, -1, -1, -1, -1, 1], np.float32)
CONVERGE_SIZES = [1000, 37]
CONVERGE_CALLS = 256


def driver_path():
    explicit = os.environ.get("DSOPT_CAR_DRIVER")
    if explicit:
        return Path(explicit)
    build = Path(os.environ.get("DSOPT_LIBRARY_DIR", conftest.REPO_ROOT / "build"))
    return build / "tests" / "internal" / "car_driver"


def bits(a):
    """The float32 values' bit patterns (so -0.0 != +0.0 and NaNs compare)."""
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


def assert_bits_equal(actual, expected, what):
    a, e = bits(actual), bits(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
    if not np.array_equal(a, e):
        bad = np.flatnonzero(a.ravel() != e.ravel())
        i = bad[0]
        raise AssertionError(
            f"{what}: {bad.size} of {a.size} elements differ; first at {i}: "
            f"{np.asarray(actual).ravel()[i]!r} vs expected {np.asarray(expected).ravel()[i]!r}")


class Job:
    """One job's files for every rank."""

    def __init__(self, root: Path, name: str, world: int, sizes):
        self.dir = root / name
        self.world = world
        self.sizes = list(sizes)

    def array(self, rank, t, kind):
        return np.load(self.dir / f"r{rank}_t{t}_{kind}.npy")

    def wire(self, rank):
        """[(call, function, elem_size, count, bytes)] of the MPI calls in run()."""
        data = (self.dir / f"r{rank}_wire.bin").read_bytes()
        out = []
        for line in (self.dir / f"r{rank}_wire.txt").read_text().splitlines():
            call, fn, es, count, off = line.split()
            es, count, off = int(es), int(count), int(off)
            out.append((int(call), fn, es, count, data[off:off + es * count]))
        return out

    def bytes_sent(self, rank):
        return [int(x) for x in (self.dir / f"r{rank}_bytes.txt").read_text().split()]


class DriverRun:
    def __init__(self, world, root: Path):
        self.world = world
        self.root = root
        jobs = [
            ("batched", "batched", CALLS, f"seed:{SEED}", SIZES),
            ("single", "single", CALLS, f"seed:{SEED}", SIZES),
        ]
        if world > 1:
            n = padded_length(8, world) * 2  # two units: every rank's chunk is whole bytes
            signs = np.resize(BIT_ORDER_SIGNS, n)
            hand = (signs * (1.0 + np.arange(n) % 3)).astype(np.float32)
            hand[8:10] = [0.0, -0.0]  # zeros of both signs encode as +1
            (root / "bitorder").mkdir(parents=True)
            for r in range(world):
                hand.tofile(root / "bitorder" / f"in_r{r}_t0.f32")
            jobs.append(("bitorder", "batched", 1, "files", [n]))
            jobs.append(("converge", "batched", CONVERGE_CALLS, "fixed:5", CONVERGE_SIZES))
        jobfile = root / "jobs.txt"
        jobfile.write_text("".join(f"{a} {b} {c} {d} {','.join(map(str, e))}\n" for a, b, c, d, e in jobs))
        # Two kernel threads on 2 ranks: the sums do not depend on the thread count.
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMP_NUM_THREADS="1", DSOPT_CAR_THREADS="2" if world == 2 else "1")
        cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", str(driver_path()),
               str(root), str(jobfile)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, f"car_driver on {world} ranks failed:\n{proc.stdout}{proc.stderr}"
        self.jobs = {name: Job(root, name, world, sizes) for name, _, _, _, sizes in jobs}

    def __getitem__(self, name):
        return self.jobs[name]


@pytest.fixture(scope="module", params=[1, 2, 3, 4], ids=lambda p: f"P{p}")
def run(request, tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    if not driver_path().exists():
        pytest.skip(f"{driver_path()} not built (set DSOPT_CAR_DRIVER or DSOPT_LIBRARY_DIR)")
    return DriverRun(request.param, tmp_path_factory.mktemp(f"car_P{request.param}"))


def reference_run(job: Job):
    """The reference's outputs, errors and wire for every call and tensor:
    result[t][call] = (out, [ew per rank], [es per rank], wire)."""
    P = job.world
    result = []
    for t, n in enumerate(job.sizes):
        inputs = [job.array(r, t, "in") for r in range(P)]
        car = CarReference(n, P)
        calls = []
        for k in range(inputs[0].shape[0]):
            out, wire = car.run([inputs[r][k] for r in range(P)])
            calls.append((out, [e.copy() for e in car.ew], [e.copy() for e in car.es], wire))
        result.append(calls)
    return result


@pytest.fixture(scope="module")
def reference(run):
    if run.world == 1:
        return None
    return reference_run(run["batched"])


# ---- the numbers ---------------------------------------------------------------


def test_outputs_and_errors_match_the_reference_bit_for_bit(run, reference):
    job = run["batched"]
    P = run.world
    if P == 1:
        pytest.skip("P = 1 is the identity (next test)")
    for t, n in enumerate(job.sizes):
        for r in range(P):
            out, ew, es = (job.array(r, t, k) for k in ("out", "ew", "es"))
            assert ew.shape == (CALLS, padded_length(n, P)), f"tensor {t} (n={n}): worker error length"
            assert es.shape == (CALLS, padded_length(n, P) // P), f"tensor {t} (n={n}): server error length"
            for k in range(CALLS):
                ref_out, ref_ew, ref_es, _ = reference[t][k]
                at = f"P={P} tensor {t} (n={n}) rank {r} call {k}"
                assert_bits_equal(out[k], ref_out, f"output, {at}")
                assert_bits_equal(ew[k], ref_ew[r], f"worker error, {at}")
                assert_bits_equal(es[k], ref_es[r], f"server error, {at}")


def test_one_rank_is_the_identity(run):
    if run.world != 1:
        pytest.skip("only for P = 1")
    job = run["batched"]
    for t, n in enumerate(job.sizes):
        assert_bits_equal(job.array(0, t, "out"), job.array(0, t, "in"), f"tensor {t} (n={n})")
    assert all(not w for w in job.wire(0)), "P = 1 made MPI calls"
    assert job.bytes_sent(0) == [0] * CALLS


def test_batched_equals_one_tensor_per_call(run):
    batched, single = run["batched"], run["single"]
    for r in range(run.world):
        for t, n in enumerate(SIZES):
            for kind in ("in", "out", "ew", "es"):
                assert_bits_equal(batched.array(r, t, kind), single.array(r, t, kind),
                                  f"{kind} of tensor {t} (n={n}) on rank {r}")


def test_every_rank_ends_with_the_same_bits(run):
    job = run["batched"]
    for t in range(len(SIZES)):
        out0 = job.array(0, t, "out")
        for r in range(1, run.world):
            assert_bits_equal(job.array(r, t, "out"), out0, f"tensor {t}, rank {r} vs rank 0")


def test_every_output_chunk_is_plus_or_minus_its_scale(run):
    P = run.world
    if P == 1:
        pytest.skip("no chunks with one rank")
    job = run["batched"]
    for t, n in enumerate(SIZES):
        out = job.array(0, t, "out")
        c = padded_length(n, P) // P
        for k in range(CALLS):
            for j in range(P):
                chunk = out[k, j * c:min(n, (j + 1) * c)]
                if chunk.size == 0:
                    continue
                mags = np.unique(bits(np.abs(chunk)))
                assert mags.size == 1, f"tensor {t} call {k} chunk {j}: {mags.size} magnitudes"
                assert np.abs(chunk[0]) > 0


def test_errors_follow_the_formulas_and_carry_over_between_calls(run):
    """Call by call from the driver's own files (not from the reference's
    chain of errors): y_i = pad(x_i) + e_w,i(k-1), s_w,i = C3 scale of y_i,
    e_w,i(k) = y_i - s_w,i sign(y_i); on rank j, z = sum_i sign(y_i) fl(s_w,i
    fl(1/P)) over chunk j, plus e_s(k-1); e_s(k) = z - s_s sign(z) and the
    output chunk j is s_s sign(z). And call 1 really used call 0's errors."""
    P = run.world
    if P == 1:
        pytest.skip("no errors with one rank")
    job = run["batched"]
    inv = np.float32(1.0) / np.float32(P)
    for t, n in enumerate(SIZES):
        npad = padded_length(n, P)
        c = npad // P
        x = [job.array(r, t, "in") for r in range(P)]
        ew = [job.array(r, t, "ew") for r in range(P)]
        es = [job.array(r, t, "es") for r in range(P)]
        out = job.array(0, t, "out")
        for k in range(CALLS):
            ys, ws = [], []
            for r in range(P):
                prev = ew[r][k - 1] if k else np.zeros(npad, np.float32)
                y = prev.copy()
                y[:n] = x[r][k] + prev[:n]
                s = car_scale(y, npad)
                assert_bits_equal(ew[r][k], sign_error(y, s), f"e_w, tensor {t} (n={n}) rank {r} call {k}")
                ys.append(y)
                ws.append(np.float32(s * inv))
            for j in range(P):
                acc = np.zeros(c, np.float32)
                for i in range(P):
                    acc = (acc + np.where(ys[i][j * c:(j + 1) * c] < 0, -ws[i], ws[i])).astype(np.float32)
                z = (acc + (es[j][k - 1] if k else np.zeros(c, np.float32))).astype(np.float32)
                ss = car_scale(z, c)
                assert_bits_equal(es[j][k], sign_error(z, ss), f"e_s, tensor {t} (n={n}) rank {j} call {k}")
                want = np.where(z < 0, -ss, ss).astype(np.float32)[:max(0, min(c, n - j * c))]
                assert_bits_equal(out[k, j * c:j * c + want.size], want,
                                  f"output chunk {j}, tensor {t} (n={n}) call {k}")
        if n >= 8:
            for r in range(P):
                y = np.zeros(npad, np.float32)
                y[:n] = x[r][1]
                fresh = sign_error(y, car_scale(y, npad))
                assert not np.array_equal(bits(fresh), bits(ew[r][1])), \
                    f"tensor {t} rank {r}: call 1 ignored call 0's worker error"


def messages(record, P):
    """The messages of one call's pieces put back together: the all-to-all
    (or all-gather) of piece p carries P blocks of equal length, block j for
    rank j (car_pieces.hpp); message j is block j of every piece in turn."""
    return [b"".join(w[4][j * (len(w[4]) // P):(j + 1) * (len(w[4]) // P)] for w in record) for j in range(P)]


def test_bit_order_msb_first_and_the_wire_layout(run, reference):
    """The all-to-alls carry, to rank j, every tensor's chunk-j bytes back to
    back (MSB first: [+,-,-,-,-,-,-,+] is 0x81), in pieces; then one
    all-gather of the worker scales, the all-gathers of this rank's server
    bytes (tensors back to back, in the same pieces) and one of the server
    scales; the byte counter says (P-1)/P N'/4 + 8(P-1)T."""
    P = run.world
    if P == 1:
        pytest.skip("no wire with one rank")
    hand = run["bitorder"]
    for r in range(P):
        a2a = [w for w in hand.wire(r) if w[1] in ("alltoallv", "alltoall")]
        assert len(a2a) == 1, hand.wire(r)
        sent = a2a[0][4]
        assert sent[0] == 0x81, f"rank {r}: first byte {sent[0]:#04x}, expected 0x81"
        x = np.fromfile(hand.dir / f"in_r{r}_t0.f32", np.float32)
        assert bytes(np.packbits(~(x < 0))) == sent, f"rank {r}: bytes {sent.hex()}"

    job = run["batched"]
    T = len(SIZES)
    padded = [padded_length(n, P) for n in SIZES]
    msg = sum(npd // P // 8 for npd in padded)
    for r in range(P):
        wire = job.wire(r)
        assert job.bytes_sent(r) == [(P - 1) * sum(padded) // (4 * P) + 8 * (P - 1) * T] * CALLS, \
            f"rank {r}: bytes_sent per call"
        for k in range(CALLS):
            calls = [w for w in wire if w[0] == k]
            a2a = [w for w in calls if w[1].startswith("alltoall")]
            gathers = [w for w in calls if w[1] == "allgather"]
            server = [w for w in gathers if w[2] == 1]
            assert len(a2a) == len(server) and len(a2a) + len(gathers) == len(calls), \
                f"call {k}: MPI calls {[w[1] for w in calls]}"
            assert sum(len(w[4]) for w in a2a) == P * msg
            expected = [b"".join(
                bytes(reference[t][k][3].worker_bytes[r][j * (padded[t] // P // 8):(j + 1) * (padded[t] // P // 8)])
                for t in range(T)) for j in range(P)]
            assert messages(a2a, P) == expected, f"rank {r} call {k}: all-to-all payload"
            scales = [np.frombuffer(w[4], np.float32) for w in gathers if w[2] == 4 and w[3] == T]
            assert b"".join(w[4] for w in server) == b"".join(bytes(reference[t][k][3].server_bytes[r]) for t in range(T)), \
                f"rank {r} call {k}: server bytes"
            assert len(scales) == 2, f"rank {r} call {k}: scale all-gathers {[(w[2], w[3]) for w in gathers]}"
            assert_bits_equal(scales[0], [reference[t][k][3].worker_scales[r] for t in range(T)],
                              f"rank {r} call {k}: worker scales")
            assert_bits_equal(scales[1], [reference[t][k][3].server_scales[r] for t in range(T)],
                              f"rank {r} call {k}: server scales")

    single = run["single"]
    for r in range(P):
        for k in range(CALLS):
            calls = [w for w in single.wire(r) if w[0] == k]
            assert sum(1 for w in calls if w[2] == 4) == 2 * T, "one tensor per call: two scale all-gathers each"
            assert sum(len(w[4]) for w in calls if w[1].startswith("alltoall")) == P * msg


def test_bit_order_output(run):
    P = run.world
    if P == 1:
        pytest.skip("no compression with one rank")
    hand = run["bitorder"]
    x = np.fromfile(hand.dir / f"in_r0_t0.f32", np.float32)
    out = hand.array(0, 0, "out")[0]
    # every rank sent the same signs: the average keeps them
    assert np.array_equal(out < 0, x < 0)


def test_time_average_of_repeated_calls_converges_to_the_mean(run):
    """Error feedback: with fixed inputs, sum over calls of (out - mean)
    telescopes into the last errors, so the running average's error falls
    like 1/T."""
    P = run.world
    if P == 1:
        pytest.skip("exact with one rank")
    job = run["converge"]
    for t, n in enumerate(CONVERGE_SIZES):
        x = np.stack([job.array(r, t, "in")[0].astype(np.float64) for r in range(P)])
        mean = x.mean(axis=0)
        out = job.array(0, t, "out").astype(np.float64)
        running = np.cumsum(out, axis=0) / np.arange(1, CONVERGE_CALLS + 1)[:, None]
        err = np.linalg.norm(running - mean, axis=1) / np.linalg.norm(mean)
        one_shot = err[0]
        assert err[15] < one_shot
        # 1/T: 16x more calls, at least 6x smaller error (T * error stays
        # about constant); and small in the end
        assert err[255] < err[15] / 6, f"tensor {t}: {err[15]:.3g} at T=16, {err[255]:.3g} at T=256"
        assert 256 * err[255] < 2.5 * 16 * err[15]
        assert 256 * err[255] < 2.5 * 64 * err[63]
        assert err[255] < 0.02 * one_shot + 1e-3, f"tensor {t}: {err[255]:.3g} vs {one_shot:.3g}"
        # the telescoping identity, call by call (real arithmetic, fp32 rounding aside)
        npad = padded_length(n, P)
        ew = np.stack([job.array(r, t, "ew").astype(np.float64) for r in range(P)])  # (P, calls, n')
        es = np.concatenate([job.array(r, t, "es").astype(np.float64) for r in range(P)], axis=1)  # (calls, n')
        assert es.shape == (CONVERGE_CALLS, npad)
        total = ew.mean(axis=0) + es  # (calls, n')
        drift = np.cumsum(out, axis=0) - np.arange(1, CONVERGE_CALLS + 1)[:, None] * mean
        scale = np.abs(out).max()
        np.testing.assert_allclose(drift, -total[:, :n], atol=1e-4 * scale * CONVERGE_CALLS ** 0.5,
                                   err_msg=f"tensor {t}: sum of (out - mean) != -(mean e_w + e_s)")


def test_reference_padding_rule_is_deepspeeds_table():
    """unit = P * lcm(P, 8) (docs/design/compressed-allreduce.md section 2)."""
    table = {1: 8, 2: 16, 4: 32, 8: 64, 16: 256, 64: 4096, 256: 65536, 1024: 1 << 20, 3: 72}
    for world, unit in table.items():
        assert padded_length(1, world) == unit
        assert padded_length(unit, world) == unit
        assert padded_length(unit + 1, world) == 2 * unit
    assert [padded_length(n, 4) for n in (1, 7, 8, 1000, 1 << 20, 13, 100, 4097)] == \
        [32, 32, 32, 1024, 1 << 20, 32, 128, 4128]
