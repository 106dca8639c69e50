"""Worker of test_deferred_gather_bindings.py (phase "deferred"): two
optimizers on the same parameters and gradients, one with
``"deferred_allgather"``; after each step the deferred one waits
parameter by parameter, or bucket by bucket, or not at all (the next step
waits), with its buckets in the reverse of parameter order
(``set_gather_order``), and the parameters are compared bit for bit."""

import sys

import numpy as np

import dsopt
from test_deferred_gather_bindings import config


def phase_deferred(comm, rank, size):
    rng = np.random.default_rng(7)
    init = [rng.standard_normal(n).astype(np.float32) for n in (300, 77, 129)]
    pa = [x.copy() for x in init]
    pb = [x.copy() for x in init]
    comm_b = dsopt.Communicator.from_mpi4py(__import__("mpi4py.MPI").MPI.COMM_WORLD.Dup())
    a = dsopt.Optimizer(config(False), pa, comm=comm)
    b = dsopt.Optimizer(config(True), pb, comm=comm_b)
    assert b.gather_buckets == a.gather_buckets > 1
    buckets = [b.gather_bucket_of(i) for i in range(3)]
    assert buckets[-1] == b.gather_buckets - 1, buckets
    if size == 2:
        # 506 elements padded to 508: shards of 254, chunks of 32 (8); the
        # last parameter lies in rank 1's chunks 3-7, the second in its 1-3,
        # the first in every chunk.
        assert buckets == [7, 3, 7], buckets
        b.set_gather_order([2, 1, 0])
        assert [b.gather_bucket_of(i) for i in range(3)] == [7, 6, 4]
    else:
        b.set_gather_order([2, 1, 0])
    # differing orders: Mismatch on every rank, nothing changed
    ordered = [b.gather_bucket_of(i) for i in range(3)]
    try:
        b.set_gather_order([0, 1, 2] if rank == 0 else [1, 0, 2])
        raise AssertionError("differing orders were accepted")
    except dsopt.Mismatch as error:
        assert "disagree on the gather order" in str(error), error
    assert [b.gather_bucket_of(i) for i in range(3)] == ordered
    for step in range(6):
        g = np.random.default_rng(100 * rank + step)
        grads = [g.standard_normal(x.size).astype(np.float32) for x in init]
        ia = a.step(grads)
        ib = b.step(grads)
        assert ia.bytes_sent == ib.bytes_sent
        if step % 3 == 0:
            for i in (2, 1, 0):
                b.wait_gather(i)
                assert np.array_equal(a.params[i], b.params[i]), (step, i)
        elif step % 3 == 1:
            for q in range(b.gather_buckets):
                b.wait_gather_bucket(q)
                for i in range(3):
                    if ordered[i] <= q:
                        assert np.array_equal(a.params[i], b.params[i]), (step, q, i)
            assert b.gathers_pending() == 0
    b.wait_gather()
    for x, y in zip(a.params, b.params):
        assert np.array_equal(x, y)
    assert a.state_dict() == b.state_dict()
    a.close()
    b.close()
    comm_b.close()
    return 6


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"deferred": phase_deferred}))
