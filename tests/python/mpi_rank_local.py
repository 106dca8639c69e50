"""Run under ``mpirun -np P`` (mpi4py) for test_rank_local.py. Phases
(``$DSOPT_TEST_PHASES``): rank_local (another rank's 1-bit Adam blob at the
same world size: Mismatch with nothing changed, or with
``reset_rank_local=True`` the compression errors reset on every rank;
AdamW's replicated blob loads anywhere), replicated (gradients equal on
every rank: ``StepInfo.grads_replicated`` on the first 3 steps and one
``DoubleReductionWarning``; different gradients: neither)."""

import sys
import warnings

import numpy as np
from mpi4py import MPI

import dsopt
from mpi_phases import main

SIZES = (300, 41)
ONEBIT = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}}, "threads": 1}
ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "threads": 1}


def make(config, comm):
    rng = np.random.default_rng(5)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    return dsopt.Optimizer(config, params, comm=comm), params


def grads(seed, step):
    rng = np.random.default_rng([seed, step])
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def worker_errors(opt):
    return np.concatenate([opt.state_view(i, "worker_error").data.copy() for i in range(len(SIZES))])


def phase_rank_local(comm, rank, size):
    world = MPI.COMM_WORLD
    nxt = (rank + 1) % size
    with make(ONEBIT, comm)[0] as opt:
        for k in range(5):  # compressing from step 3
            opt.step(grads(rank, k))
        blobs = world.allgather(opt.state_dict())
        saved_errors = worker_errors(opt)
    assert np.any(saved_errors != 0)
    opt, params = make(ONEBIT, comm)
    with opt:
        before = opt.state_dict()
        try:
            opt.load_state_dict(blobs[nxt])
        except dsopt.Mismatch as e:
            text = str(e)
        else:
            raise AssertionError("another rank's blob loaded")
        assert f"saved by rank {nxt}" in text and "reset_rank_local=True" in text, text
        assert opt.state_dict() == before, "a rejected load changed the state"
        try:
            opt.load_state_dict(blobs[rank], reset_rank_local="yes")
        except dsopt.InvalidArgumentType:
            pass
        else:
            raise AssertionError("reset_rank_local must be a bool")
        assert opt.load_state_dict(blobs[nxt], reset_rank_local=True) is True
        assert not np.any(worker_errors(opt)), "the errors were not reset"
        opt.step(grads(rank, 5))  # and the run goes on
        assert opt.load_state_dict(blobs[rank], reset_rank_local=True) is False
        assert np.array_equal(worker_errors(opt), saved_errors), "own blob: errors restored"
        assert opt.load_state_dict(blobs[rank]) is False
    with make(ADAMW, comm)[0] as opt:
        opt.step(grads(rank, 0))
        blobs = world.allgather(opt.state_dict())
        assert opt.load_state_dict(blobs[nxt]) is False  # replicated: any rank's
    return "ok"


def phase_replicated(comm, rank, size):
    for seed, expected in ((0, [True] * 3 + [False] * 2), (rank, [False] * 5)):
        with make(ADAMW, comm)[0] as opt, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = [opt.step(grads(seed, k)).grads_replicated for k in range(5)]
        assert got == expected, (seed, got)
        double = [w for w in caught if issubclass(w.category, dsopt.DoubleReductionWarning)]
        assert len(double) == (1 if expected[0] else 0), [str(w.message) for w in caught]
        if double:
            text = str(double[0].message)
            assert "register_comm_hook(None, dsopt.torch.ddp_comm_hook)" in text, text
            assert "DistributedDataParallel" in text and double[0].filename == __file__, double[0]
    return "ok"


PHASES = {"rank_local": phase_rank_local, "replicated": phase_replicated}

if __name__ == "__main__":
    sys.exit(main(PHASES))
