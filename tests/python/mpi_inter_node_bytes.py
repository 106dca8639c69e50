"""Run under ``mpirun -np 4`` or ``-np 6`` by test_inter_node_bytes.py:
``dsopt_step_info.bytes_inter_node`` of the flat collectives against the
pairwise count (docs/reference/c-api.md "Step info"), with nodes declared
by ``"topology": {"ranks_per_node": R}``, for every R that divides the
world. Every check runs on the ranks."""

import numpy as np

import dsopt
from mpi_phases import main

SIZES = (1000, 37, 4096)


def run(config, comm, steps=3):
    rng = np.random.default_rng([7, comm.rank])
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    infos = []
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for _ in range(steps):
            infos.append(opt.step([rng.standard_normal(n).astype(np.float32) for n in SIZES]))
    return infos


def pairwise(info, size, r):
    """Every collective sends each other rank alike: (P-R)/(P-1) of the
    bytes go to other nodes, up to each collective's rounding."""
    exact = info.bytes_sent * (size - r)
    assert abs(info.bytes_inter_node * (size - 1) - exact) <= 8 * (size - 1) ** 2, (r, info)


def phase_allreduce(comm, rank, size):
    """AdamW's averaging is one allreduce of the n gradients: 2 (P-1)/P n
    floats sent, of which those to the P - R ranks of other nodes are
    2 (P-R)/P n (pairwise), beside the few bytes of the step's checks. No
    node declared: the one machine's."""
    n = sum(SIZES)
    checked = 0
    for r in [d for d in range(1, size + 1) if size % d == 0]:
        config = {"optimizer": {"type": "AdamW"}, "threads": 1, "topology": {"ranks_per_node": r}}
        for info in run(config, comm):
            gradients = 2 * (size - 1) * n * 4 // size
            assert gradients <= info.bytes_sent < gradients + 256, (r, info)
            assert info.bytes_inter_node >= 2 * (size - r) * n * 4 // size, (r, info)
            pairwise(info, size, r)
        checked += 1
    for info in run({"optimizer": {"type": "AdamW"}, "threads": 1}, comm):
        assert info.bytes_sent > 0 and info.bytes_inter_node == 0, info
    return checked


def phase_alltoall(comm, rank, size):
    """1-bit Adam's compressed steps (flat form): its all-to-all and
    allgathers send each other rank the same number of bytes, so the part
    to other nodes is (P-R)/(P-1) of them."""
    checked = 0
    for r in [d for d in range(1, size + 1) if size % d == 0]:
        config = {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 1}}, "threads": 1,
                  "topology": {"ranks_per_node": r, "hierarchy": "flat"}}
        infos = run(config, comm, steps=4)
        for info in infos[1:]:
            assert info.compressed, info
            pairwise(info, size, r)
        checked += 1
    return checked


def phase_bad_nodes(comm, rank, size):
    """Declared nodes that do not divide the world are refused at creation
    on every rank, naming the key."""
    for r in (size - 1, size + 1, 2 * size):
        try:
            run({"optimizer": {"type": "AdamW"}, "topology": {"ranks_per_node": r}}, comm, steps=1)
        except dsopt.InvalidArgument as e:
            assert "ranks_per_node" in str(e), e
        else:
            raise AssertionError(f"ranks_per_node {r} at {size} ranks was accepted")
    return 3


if __name__ == "__main__":
    raise SystemExit(main({"allreduce": phase_allreduce, "alltoall": phase_alltoall,
                           "bad_nodes": phase_bad_nodes}))
