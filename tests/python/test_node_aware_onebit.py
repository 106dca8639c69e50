"""1-bit Adam, 1-bit LAMB and 0/1 Adam with the node-aware compressed
allreduce ("topology": {"hierarchy": "node_aware", "ranks_per_node": 2}) under
``mpirun`` at 4 ranks (2 nodes of 2) and 6 ranks (3 x 2), run by
mpi_node_aware_onebit.py: parameters, moments and every rank's compression
errors equal the numpy references of the optimizers with the hierarchical
allreduce of node_aware_reference.py in place of the flat one, bit for bit on
every rank; the bytes sent and those sent to other nodes equal the formulas
of docs/design/node-aware-allreduce.md section 3 (the library's counts);
resuming at the same topology is bit-identical; a blob loaded under another
topology resets the errors and reports it. Both node steps: fp32 (the form
``node_aware``) and 1-bit (``"node_reduce": "1bit"``, ``node_aware_1bit``,
whose node worker errors the blob holds as ``<opt>.node_error``)."""

import contextlib
import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

import lamb_runs
import mpi_runner
import node_aware_reference as nar
import onebit_lamb_reference
import onebit_reference
import onebit_runs
import zoadam_reference
import zoadam_runs
from dsopt_testing import build_feature
from mpi_node_aware_onebit import NODE_AWARE, OPTIMIZERS, with_topology
from test_onebit_adam import assert_same_bits

SCRIPT = Path(__file__).with_name("mpi_node_aware_onebit.py")
R = 2
LAYOUTS = {4: "2x2", 6: "3x2"}
CAR_PHASES = (2, 4)  # DSOPT_PHASE_COMPRESSED, DSOPT_PHASE_SYNC: the steps that run the compressed allreduce


@pytest.fixture(scope="module")
def mpi_dirs(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin)")
    if build_feature("mpi") == "off":
        pytest.skip("libdsopt was built without MPI")
    return {world: mpi_runner.mpirun(SCRIPT, world, tmp_path_factory.mktemp(f"node_aware_{LAYOUTS[world]}"),
                                     ["scenarios", "resume", "topology", "flat_bits"],
                                     {"DSOPT_NA_RANKS_PER_NODE": str(R)}, timeout=600)
            for world in LAYOUTS}


# ---- the references with the hierarchical allreduce ---------------------------------------


class NodeAwareCar:
    """onebit_reference.CarReference's interface (run, reset, ew[rank],
    es[rank]) over node_aware_reference.NodeAwareReference: N = world / R
    nodes of R ranks."""

    onebit = False  # the 1-bit node step (set by node_aware_references)

    def __init__(self, n, world):
        self.na = nar.NodeAwareReference(n, world // R, R, self.onebit)
        self.world = world

    def run(self, xs):
        return self.na.run(xs)

    def reset(self):
        for car in self.na.rails + self.na.node_cars:
            car.reset()

    @property
    def ew(self):
        return [self.na.worker_error(r) for r in range(self.world)]

    @property
    def es(self):
        return [self.na.server_error(r) for r in range(self.world)]


@contextlib.contextmanager
def node_aware_references(onebit):
    modules = (onebit_reference, onebit_lamb_reference, zoadam_reference)
    saved = [m.CarReference for m in modules]
    car = type("NodeAwareCar", (NodeAwareCar,), {"onebit": onebit})
    for m in modules:
        m.CarReference = car
    try:
        yield
    finally:
        for m, c in zip(modules, saved):
            m.CarReference = c


@functools.lru_cache(maxsize=None)
def reference(opt, name, world, form="node_aware"):
    runs = OPTIMIZERS[opt][0]
    sc = runs.BY_NAME[name]
    with node_aware_references(form == "node_aware_1bit"):
        if opt == "zoadam":
            return zoadam_runs.run_reference(sc, world)
        ref = runs.reference_for(sc, world)
        grads_for = OPTIMIZERS[opt][1]
        infos = [ref.step([grads_for(sc, k, r, world) for r in range(world)]) for k in range(sc.steps)]
        return ref, infos


def reference_state(opt, ref, rank):
    """{section: expected floats} of `rank`'s blob."""
    if opt == "onebit":
        m, v, ew, es = onebit_runs.reference_state(ref, rank)
        return {"onebit.exp_avg": m, "onebit.exp_avg_sq": v, "onebit.worker_error": ew, "onebit.server_error": es}
    if opt == "lamb":
        want = lamb_runs.reference_blob_state(ref, rank)
        return {"lamb.exp_avg": want["m"], "lamb.exp_avg_sq": want["v"], "lamb.exp_avg_sq_fresh": want["vf"],
                "lamb.momentum_tail": want["tail"], "lamb.worker_error": want["ew"], "lamb.server_error": want["es"]}
    want = zoadam_runs.reference_state(ref, rank)
    names = dict(m="exp_avg", v="exp_avg_sq", acc="accumulator", anchor="anchor", ew="worker_error",
                 es="server_error")
    return {f"zoadam.{names[k]}": x for k, x in want.items()}


def node_errors(opt, ref, rank):
    """The 1-bit node step's node worker errors of `rank`, back to back (an
    empty array without them)."""
    cars = ([ref.car] if ref.car is not None else []) if opt == "lamb" else \
        ([ref.cars[i] for i in ref.compressed_indices()] if opt == "onebit" else ref.cars) or []
    errors = [c.na.node_error(rank) for c in cars if c.na.onebit]
    return np.concatenate(errors) if errors else np.zeros(0, np.float32)


def ref_params(opt, ref, rank):
    return ref.params(rank) if opt == "zoadam" else ref.params()


def cases():
    for opt, (runs, _, names, _) in OPTIMIZERS.items():
        for name in names:
            yield opt, name


# ---- the numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize("form", NODE_AWARE)
@pytest.mark.parametrize("world", sorted(LAYOUTS), ids=lambda w: LAYOUTS[w])
@pytest.mark.parametrize("opt,name", list(cases()))
def test_matches_the_node_aware_reference_bit_for_bit(opt, name, world, form, mpi_dirs):
    """Every rank's parameters and state equal the reference's bits (the
    same parameters on every rank), its compression errors the rail
    allreduce's of its slices, and the blob records the topology."""
    runs = OPTIMIZERS[opt][0]
    sc = runs.BY_NAME[name]
    ref, ref_infos = reference(opt, name, world, form)
    onebit = form == "node_aware_1bit"
    assert any(i.get("compressed") or i.get("phase") in CAR_PHASES for i in ref_infos)
    for r in range(world):
        params, infos, blobs = onebit_runs.load_npz(mpi_dirs[world] / f"{opt}_{name}_{form}_r{r}.npz",
                                                    len(sc.sizes))
        at = f"{opt} {name} {LAYOUTS[world]} {form} rank {r}"
        assert [int(x) for x in infos[:, 2]] == [i["step"] for i in ref_infos], f"{at}: info.step"
        for i, (p, e) in enumerate(zip(params, ref_params(opt, ref, r))):
            assert_same_bits(p, e, f"{at}: param {i}")
        blob = onebit_runs.parse_blob(blobs["blob"])
        for section, want in reference_state(opt, ref, r).items():
            assert_same_bits(blob.floats(section), want, f"{at}: {section}")
        want = node_errors(opt, ref, r)
        assert (want.size > 0) is onebit, at
        if onebit:
            assert_same_bits(blob.floats(f"{opt}.node_error"), want, f"{at}: {opt}.node_error")
        else:
            assert f"{opt}.node_error" not in blob.sections, f"{at}: a node error section without the 1-bit node step"
        ranks, nodes, rule = np.frombuffer(blob.sections[f"{opt}.topology"], np.int32)
        assert (ranks, nodes, rule) == (R, world // R, 2 if onebit else 1), f"{at}: topology record"


@pytest.mark.parametrize("form", NODE_AWARE)
@pytest.mark.parametrize("world", sorted(LAYOUTS), ids=lambda w: LAYOUTS[w])
@pytest.mark.parametrize("opt,name", list(cases()))
def test_bytes_equal_the_formulas(opt, name, world, form, mpi_dirs):
    """Per step, the node-aware run sends what the flat run sends but for
    the compressed allreduce: the flat form's (P - 1)(2 sum n'/8P + 8T)
    replaced by the rail's (N - 1)(2 sum n''/8N + 8T) across nodes and the
    node's reduce-scatter of sum m fp32 values and allgather of the
    rail's codes inside it (node_aware_reference.node_bytes); of the bytes to other nodes, the
    flat form's (P - R)(...) by the rail's. At 2 x 2 the compressed steps
    send at most 0.55 of the flat form's bytes to other nodes."""
    runs = OPTIMIZERS[opt][0]
    sc = runs.BY_NAME[name]
    P, N = world, world // R
    sizes = ([onebit_reference.padded_length(sum(sc.sizes), P)] if opt == "lamb" else list(sc.sizes))
    onebit = form == "node_aware_1bit"
    rail = nar.rail_bytes(sizes, N, R, onebit)
    node = nar.node_bytes(sizes, N, R, onebit)
    flat_all = nar.flat_bytes(sizes, P, P - 1)
    flat_cross = nar.flat_bytes(sizes, P, P - R)
    for r in range(world):
        _, na, _ = onebit_runs.load_npz(mpi_dirs[world] / f"{opt}_{name}_{form}_r{r}.npz", len(sc.sizes))
        _, fl, _ = onebit_runs.load_npz(mpi_dirs[world] / f"{opt}_{name}_flat_r{r}.npz", len(sc.sizes))
        car = [bool(a[1]) and (opt != "zoadam" or int(a[5]) in CAR_PHASES) for a in na]
        assert any(car)
        for k, (a, b, c) in enumerate(zip(na, fl, car)):
            at = f"{opt} {name} {LAYOUTS[world]} {form} rank {r} step {k}"
            sent, cross, flat_sent, flat_cross_got = int(a[3]), int(a[6]), int(b[3]), int(b[6])
            if not c:
                assert (sent, cross) == (flat_sent, flat_cross_got), at
                continue
            assert sent - rail - node == flat_sent - flat_all, at
            assert cross - rail == flat_cross_got - flat_cross, at
            if world == 4:
                assert cross <= 0.55 * flat_cross_got, (at, cross, flat_cross_got)


@pytest.mark.parametrize("form", NODE_AWARE)
@pytest.mark.parametrize("world", sorted(LAYOUTS), ids=lambda w: LAYOUTS[w])
@pytest.mark.parametrize("opt,name", list(cases()))
def test_resume_at_the_same_topology_is_bit_identical(opt, name, world, form, mpi_dirs):
    runs = OPTIMIZERS[opt][0]
    sc = runs.BY_NAME[name]
    for s in OPTIMIZERS[opt][3]:
        for r in range(world):
            whole_params, _, whole = onebit_runs.load_npz(
                mpi_dirs[world] / f"{opt}_{name}_{form}_r{r}.npz", len(sc.sizes))
            params, _, resumed = onebit_runs.load_npz(
                mpi_dirs[world] / f"{opt}_{name}_{form}_resume{s}_r{r}.npz", len(sc.sizes))
            for i, (a, b) in enumerate(zip(params, whole_params)):
                assert_same_bits(a, b, f"{opt} {name} after {s}, rank {r}: param {i}")
            assert resumed["blob"] == whole["blob"], f"{opt} {name} after {s}, rank {r}: final blobs differ"


@pytest.mark.parametrize("world", sorted(LAYOUTS), ids=lambda w: LAYOUTS[w])
def test_load_under_another_topology_resets_the_errors(world, mpi_dirs):
    """Node-aware blob into a flat optimizer, flat into node-aware, one node
    step into the other: the errors are zero and load_state_dict returns
    True; the same form restores them and returns False
    (mpi_node_aware_onebit.py)."""
    for r in range(world):
        lines = (mpi_dirs[world] / f"rank{r}.txt").read_text().splitlines()
        assert f"topology OK {6 * len(OPTIMIZERS)}" in lines, lines


def test_one_rank_per_node_and_flat_are_todays_bits(mpi_dirs):
    """No topology key, "flat" on nodes of 2 and "node_aware" on nodes of 1
    (the rail allreduce is the flat one over every rank): the same
    parameters, state and bytes sent, bit for bit (mpi_node_aware_onebit.py);
    the flat tests of test_onebit_adam.py, test_onebit_lamb.py and
    test_zero_one_adam.py run unchanged."""
    for world in LAYOUTS:
        for r in range(world):
            lines = (mpi_dirs[world] / f"rank{r}.txt").read_text().splitlines()
            assert f"flat_bits OK {2 * len(OPTIMIZERS)}" in lines, lines
