"""A gradient that the Python layer cannot describe on one rank (another
dtype, a non-contiguous array, a sparse torch tensor) fails that step on
every rank, instead of raising on that rank before the collective call while
the others wait for it: the binding still makes the call, with gradients C
rejects, so C's step agreement fails every rank (that rank with its own
error, the others with InvalidArgument naming it). Nothing changes, and the
next step works everywhere. Two ranks are threads on a callback
communicator (test_callback_comm's ThreadWorld)."""

import numpy as np
import pytest

import dsopt
from test_callback_comm import ADAMW, SIZES, ThreadWorld, gradients, initial_params

BAD = {"int32": lambda g: g.astype(np.int32),
       "strided": lambda g: np.repeat(g, 2)[::2],
       "not_an_array": lambda g: g.tolist()}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_gradient_one_rank_cannot_describe_fails_every_ranks_step(bad, bad_rank):
    world = ThreadWorld(2)
    errors = [None, None]

    def rank_main(rank):
        params = initial_params()
        with world.communicator(rank) as comm, dsopt.Optimizer(ADAMW, params, comm=comm) as opt:
            opt.step(gradients(rank, 0))
            blob, before = opt.state_dict(), [p.copy() for p in params]
            grads = gradients(rank, 1)
            if rank == bad_rank:
                grads[1] = BAD[bad](grads[1])
            with pytest.raises(dsopt.DsoptError) as error:
                opt.step(grads)
            errors[rank] = error.value
            assert opt.state_dict() == blob
            assert all(p.tobytes() == b.tobytes() for p, b in zip(params, before))
            opt.step(gradients(rank, 1))  # the ranks still agree
        return params

    after = world.run(rank_main)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(after[0], after[1]))
    other = errors[1 - bad_rank]
    assert isinstance(other, dsopt.InvalidArgument), other
    assert f"rank {bad_rank} passed gradients that do not fit" in str(other)
    assert "grads[1]" in str(errors[bad_rank]), errors[bad_rank]


def test_the_torch_optimizer_agrees_on_a_sparse_gradient():
    torch = pytest.importorskip("torch")
    import dsopt.torch as dtorch
    world = ThreadWorld(2)
    errors = [None, None]

    def rank_main(rank):
        params = [torch.nn.Parameter(torch.from_numpy(p)) for p in initial_params()]
        with world.communicator(rank) as comm:
            opt = dtorch.AdamW(params, lr=0.01, comm=comm)
            for p, g in zip(params, gradients(rank, 0)):
                p.grad = torch.from_numpy(g)
            opt.step()
            before = [p.detach().clone() for p in params]
            for p, g in zip(params, gradients(rank, 1)):
                p.grad = torch.from_numpy(g)
            if rank == 1:
                params[2].grad = params[2].grad.to_sparse()
            with pytest.raises((RuntimeError, dsopt.DsoptError)) as error:
                opt.step()
            errors[rank] = error.value
            assert all(torch.equal(p, b) for p, b in zip(params, before))
            params[2].grad = torch.from_numpy(gradients(rank, 1)[2])
            opt.step()
            opt.dsopt.close()

    world.run(rank_main)
    assert "sparse" in str(errors[1])
    assert isinstance(errors[0], dsopt.InvalidArgument)
    assert "rank 1 passed gradients that do not fit" in str(errors[0])
