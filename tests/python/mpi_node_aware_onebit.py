"""Run under ``mpirun -np P`` by test_node_aware_onebit.py: 1-bit Adam, 1-bit
LAMB and 0/1 Adam with ``"topology": {"hierarchy": "node_aware",
"ranks_per_node": R}`` (``$DSOPT_NA_RANKS_PER_NODE``), the same with the 1-bit
node step (``"node_reduce": "1bit"``, the form ``node_aware_1bit``), and the
same runs with ``"hierarchy": "flat"`` for the byte counts. Phases
(``$DSOPT_TEST_PHASES``):

* scenarios: every scenario of ``SCENARIOS`` both ways, saving blobs after
  the ``SAVE_AFTER`` updates of its optimizer (npz files, onebit_runs.save_npz
  with the infos of ``info_rows``);
* resume: each node-aware blob (both node steps) loaded into a fresh
  optimizer of its form, run to the end;
* topology: a blob loaded under another topology (node-aware into flat, flat
  into node-aware, one node step into the other) resets the compression
  errors and says so (``load_state_dict`` returns True); the same topology
  restores them (False).
"""

import copy
import dataclasses
import os
import sys

import numpy as np

import dsopt
import lamb_runs
import onebit_runs
import zoadam_runs
from mpi_phases import main, out_path

# optimizer -> (runs module, its grads_for, scenario names, updates after which blobs are saved)
OPTIMIZERS = {
    "onebit": (onebit_runs, onebit_runs.grads_for, ("weight_decay", "stable_weight_decay", "fp16"), (3, 6)),
    "lamb": (lamb_runs, onebit_runs.grads_for, ("weight_decay", "stable_weight_decay"), (3, 6)),
    "zoadam": (zoadam_runs, zoadam_runs.grads_for, ("weight_decay", "stable_weight_decay"), (5, 13)),
}
ERRORS = {"onebit": "onebit", "lamb": "lamb", "zoadam": "zoadam"}


def ranks_per_node():
    return int(os.environ["DSOPT_NA_RANKS_PER_NODE"])


# The node-aware forms: the fp32 node step and the 1-bit one.
NODE_AWARE = ("node_aware", "node_aware_1bit")


def with_topology(sc, hierarchy, r):
    """hierarchy: "flat", "node_aware" or "node_aware_1bit"."""
    config = copy.deepcopy(sc.config)
    config["topology"] = {"hierarchy": hierarchy.replace("_1bit", ""), "ranks_per_node": r}
    if hierarchy.endswith("_1bit"):
        config["topology"]["node_reduce"] = "1bit"
    return dataclasses.replace(sc, config=config)


def scenarios():
    for opt, (runs, grads_for, names, save_after) in OPTIMIZERS.items():
        for name in names:
            yield opt, runs, grads_for, runs.BY_NAME[name], save_after


def info_rows(infos):
    return np.array([[i.skipped, i.compressed, i.step, i.bytes_sent, i.grad_norm, i.phase, i.bytes_inter_node]
                     for i in infos], dtype=np.float64).reshape(-1, 7)


def save_npz(path, params, infos, **blobs):
    arrays = {f"p{i}": p for i, p in enumerate(params)}
    arrays["infos"] = info_rows(infos)
    for name, b in blobs.items():
        arrays[name] = np.frombuffer(b, np.uint8)
    np.savez(path, **arrays)


def open_opt(sc, comm, params):
    opt = dsopt.Optimizer(sc.config, onebit_runs.as_dsopt_params(params, sc.kinds), comm=comm, groups=sc.groups)
    for i, kind in sc.masks.items():
        opt.set_momentum_mask(i, onebit_runs.make_mask(kind, sc.sizes[i]))
    return opt


def run(sc, grads_for, comm, rank, size, save_after=(), start=0, blob=None, params=None):
    """Runs the scenario from update `start` (loading `blob` with `params`
    when given). Returns (params, infos, final blob, {update: (blob, params)})."""
    if params is None:
        params = onebit_runs.initial_params(sc)
    else:
        params = [p.copy() if k == "fp32" else np.zeros_like(p) for p, k in zip(params, sc.kinds)]
    saved, infos = {}, []
    with open_opt(sc, comm, params) as opt:
        if blob is not None:
            assert opt.load_state_dict(blob) is False, "the same topology resets nothing"
        for k in range(start, sc.steps):
            infos.append(opt.step(grads_for(sc, k, rank, size)))
            if k + 1 in save_after:
                saved[k + 1] = (opt.state_dict(), [p.copy() for p in params])
        final = opt.state_dict()
    return params, infos, final, saved


def phase_scenarios(comm, rank, size):
    r = ranks_per_node()
    for opt, runs, grads_for, sc, save_after in scenarios():
        for hierarchy in NODE_AWARE + ("flat",):
            params, infos, blob, saved = run(with_topology(sc, hierarchy, r), grads_for, comm, rank, size, save_after)
            tag = f"{opt}_{sc.name}_{hierarchy}"
            save_npz(out_path(f"{tag}_r{rank}.npz"), params, infos, blob=blob)
            for s, (b, p) in saved.items():
                save_npz(out_path(f"{tag}_saved{s}_r{rank}.npz"), p, [], blob=b)
    return "done"


def phase_resume(comm, rank, size):
    r = ranks_per_node()
    for opt, runs, grads_for, sc, save_after in scenarios():
        for form in NODE_AWARE:
            na = with_topology(sc, form, r)
            for s in save_after:
                p, _, blobs = onebit_runs.load_npz(out_path(f"{opt}_{sc.name}_{form}_saved{s}_r{rank}.npz"),
                                                   len(sc.sizes))
                params, infos, final, _ = run(na, grads_for, comm, rank, size, start=s, blob=blobs["blob"],
                                              params=p)
                save_npz(out_path(f"{opt}_{sc.name}_{form}_resume{s}_r{rank}.npz"), params, infos, blob=final)
    return "done"


def worker_errors(opt, count):
    return [opt.state_view(i, "worker_error").data.copy() for i in range(count)]


def phase_topology(comm, rank, size):
    """The compressing blobs of each optimizer's first scenario, loaded
    across topologies: reset reported, errors zero, the run goes on."""
    r = ranks_per_node()
    checked = 0
    for opt, (runs, grads_for, names, save_after) in OPTIMIZERS.items():
        sc = runs.BY_NAME[names[0]]
        s = save_after[-1]
        for src, dst in (("node_aware", "flat"), ("flat", "node_aware"), ("node_aware", "node_aware"),
                         ("node_aware_1bit", "node_aware"), ("node_aware", "node_aware_1bit"),
                         ("node_aware_1bit", "node_aware_1bit")):
            p, _, blobs = onebit_runs.load_npz(out_path(f"{opt}_{sc.name}_{src}_saved{s}_r{rank}.npz"), len(sc.sizes))
            target = with_topology(sc, dst, r)
            params = [x.copy() if k == "fp32" else np.zeros_like(x) for x, k in zip(p, sc.kinds)]
            with open_opt(target, comm, params) as o:
                reset = o.load_state_dict(blobs["blob"])
                errors = np.concatenate(worker_errors(o, len(sc.sizes)))
                assert reset is (src != dst), (opt, src, dst, reset)
                if src != dst:
                    assert not np.any(errors), f"{opt} {src} -> {dst}: errors not reset"
                else:
                    assert np.any(errors), f"{opt}: errors of the same topology not restored"
                infos = [o.step(grads_for(sc, k, rank, size)) for k in range(s, s + 2)]
                assert all(i.compressed or i.phase in (dsopt.PHASE_LOCAL, dsopt.PHASE_SYNC) for i in infos)
            checked += 1
    return checked


def phase_flat_bits(comm, rank, size):
    """No topology key (today's runs), "flat" on nodes of R ranks and
    "node_aware" on nodes of one rank: the same parameters, state sections
    (all but the run's id, which its config names) and bytes sent, bit for
    bit."""
    r = ranks_per_node()
    checked = 0
    for opt, (runs, grads_for, names, save_after) in OPTIMIZERS.items():
        sc = runs.BY_NAME[names[0]]
        base_params, base_infos, base_blob, _ = run(sc, grads_for, comm, rank, size)
        base = onebit_runs.parse_blob(base_blob).sections
        for hierarchy, per_node in (("flat", r), ("node_aware", 1)):
            params, infos, blob, _ = run(with_topology(sc, hierarchy, per_node), grads_for, comm, rank, size)
            at = f"{opt} {hierarchy} R={per_node}"
            for a, b in zip(params, base_params):
                assert a.tobytes() == b.tobytes(), f"{at}: parameters differ"
            sections = onebit_runs.parse_blob(blob).sections
            for name, data in base.items():
                if name == "common.run":  # the run's id: named by its config
                    continue
                assert sections[name] == data, f"{at}: section {name} differs"
            assert [i.bytes_sent for i in infos] == [i.bytes_sent for i in base_infos], at
            assert any(i.compressed for i in infos), at
            checked += 1
    return checked


PHASES = {"scenarios": phase_scenarios, "resume": phase_resume, "topology": phase_topology,
          "flat_bits": phase_flat_bits}


if __name__ == "__main__":
    sys.exit(main(PHASES))
