"""dsopt_state_memory_usage (Optimizer.state_memory_usage): the part of
dsopt_memory_usage that is state the blob saves, generated from each
algorithm's state schema. Every type at one rank, fp32 and bf16
parameters, against the arrays each one keeps (docs/reference/c-api.md
"Momentum masks and memory"); ZeRO's shards on 1 to 4 ranks:
test_zero.py (mpi_zero.py, phase memory)."""

import numpy as np
import pytest

import dsopt
from halfprec import to_bf16_bits

SIZES = (37, 1000, 3)
# fp32 arrays of every parameter element each type keeps at one rank
# (masters of 16-bit parameters come on top).
ARRAYS = {"AdamW": 2, "Lamb": 2, "OneBitAdam": 2, "OneBitLamb": 3, "ZeroOneAdam": 4}


def params(kind):
    rng = np.random.default_rng(0)
    out = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    return [dsopt.bf16(to_bf16_bits(p)) for p in out] if kind == "bf16" else out


def grads(step):
    rng = np.random.default_rng(step)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


@pytest.mark.parametrize("kind", ["fp32", "bf16"])
@pytest.mark.parametrize("opt_type", sorted(ARRAYS))
def test_state_is_the_arrays_the_algorithm_keeps(opt_type, kind):
    n = sum(SIZES)
    want = 4 * n * ARRAYS[opt_type] + (4 * n if kind == "bf16" else 0)
    config = {"optimizer": {"type": opt_type}}
    with dsopt.Optimizer(config, params(kind)) as opt:
        for k in range(3):
            opt.step(grads(k))
            state, total = opt.state_memory_usage(), opt.memory_usage()
            assert state == {"host": want, "device": 0}, (k, state)
            assert state["host"] <= total["host"]


@pytest.mark.parametrize("opt_type", ["AdamW", "Lamb"])
def test_zero_on_one_rank_keeps_the_same_state(opt_type):
    """A 16-bit parameter's master moves from the parameter set into the
    shard; the total stays, the gradient shard and scratch come on top."""
    n = sum(SIZES)
    padded = n + n % 2
    config = {"optimizer": {"type": opt_type}, "zero_optimization": {"stage": 2}}
    with dsopt.Optimizer(config, params("bf16")) as opt:
        opt.step(grads(0))
        assert opt.state_memory_usage() == {"host": 4 * n + 8 * padded, "device": 0}
