"""A gradient that the Python layer cannot describe on one rank (another
dtype, a non-contiguous array, a sparse torch tensor) fails that step on
every rank, instead of raising on that rank before the collective call while
the others wait for it: the binding still makes the call, with gradients C
rejects, so C's step agreement fails every rank (that rank with its own
error, the others with Mismatch naming it). Nothing changes, and the
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
    assert isinstance(other, dsopt.Mismatch), other
    assert f"rank {bad_rank} passed gradients that could not be used" in str(other)
    assert "grads[1]" in str(errors[bad_rank]), errors[bad_rank]


@pytest.mark.parametrize("overlap", [False, True], ids=["step", "overlap"])
def test_the_torch_optimizer_agrees_on_a_sparse_gradient(overlap):
    """dsopt.torch: without overlap the step describes .grad; with
    overlap=True the backward hooks hand gradients over, and a sparse one
    is kept for step(), which abandons the step (dsopt_step(NULL, -1)) after
    the reductions already started."""
    torch = pytest.importorskip("torch")
    import dsopt.torch as dtorch
    world = ThreadWorld(2)
    errors = [None, None]

    def backward(params, rank, step, sparse):
        # .grad through autograd, so that overlap's hooks see each gradient
        for p, g in zip(params, gradients(rank, step)):
            target = torch.from_numpy(g)
            if sparse and p is params[2]:
                target = target.to_sparse()
                p.grad = target
                if overlap:  # the hook of a .grad set by hand: as autograd would call it
                    for hook in getattr(p, "_post_accumulate_grad_hooks", {}).values():
                        hook(p)
                continue
            (p * target).sum().backward()

    def rank_main(rank):
        params = [torch.nn.Parameter(torch.from_numpy(p)) for p in initial_params()]
        with world.communicator(rank) as comm:
            opt = dtorch.AdamW(params, lr=0.01, comm=comm, overlap=overlap)
            backward(params, rank, 0, False)
            opt.step()
            opt.zero_grad()
            before = [p.detach().clone() for p in params]
            backward(params, rank, 1, rank == 1)
            with pytest.raises((RuntimeError, dsopt.DsoptError)) as error:
                opt.step()
            errors[rank] = error.value
            assert all(torch.equal(p, b) for p, b in zip(params, before))
            opt.zero_grad()
            backward(params, rank, 1, False)
            opt.step()
            opt.dsopt.close()
        return [p.detach().clone() for p in params]

    after = world.run(rank_main)
    assert all(torch.equal(a, b) for a, b in zip(after[0], after[1]))
    assert "sparse" in str(errors[1])
    assert isinstance(errors[0], dsopt.Mismatch), errors[0]
    assert "rank 1 passed gradients that could not be used" in str(errors[0])


def test_an_invalid_hyperparameter_on_one_rank_fails_every_ranks_step():
    """dsopt.torch validates param_groups' values as torch does (ValueError)
    before the step; on one rank only, the others fail too, naming it."""
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
            if rank == 1:
                opt.param_groups[0]["lr"] = -1.0
            with pytest.raises((ValueError, dsopt.DsoptError)) as error:
                opt.step()
            errors[rank] = error.value
            assert all(torch.equal(p, b) for p, b in zip(params, before))
            opt.param_groups[0]["lr"] = 0.01
            opt.step()
            opt.dsopt.close()
        return [p.detach().clone() for p in params]

    after = world.run(rank_main)
    assert all(torch.equal(a, b) for a, b in zip(after[0], after[1]))
    assert "learning rate" in str(errors[1]).lower(), errors[1]
    assert isinstance(errors[0], dsopt.Mismatch), errors[0]
    assert "rank 1 passed gradients that could not be used" in str(errors[0])
