"""dsopt.Communicator.from_callbacks: dsopt's collectives as Python callables
(dsopt_comm_create_custom). No torch and no MPI: a world of one rank, and
"ranks" that are threads of this process exchanging numpy arrays
(ThreadWorld below; dsopt calls release the GIL, so the threads step
together)."""

import gc
import threading
import weakref

import numpy as np
import pytest

import dsopt
from dsopt import _callback_comm

ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
         "threads": 1}
ONEBIT = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}},
          "threads": 1}
SIZES = (37, 300, 5)


class ThreadWorld:
    """Collectives among `size` threads: every rank puts a copy of its send
    buffer in a slot, all wait, each computes its result from the slots,
    all wait again. A rank that fails aborts the barrier, so the others
    raise threading.BrokenBarrierError instead of waiting. ``sync`` is a
    barrier for the test's own steps (never aborted: a thread still waking
    from a barrier that another then aborts would see it broken)."""

    def __init__(self, size, timeout=20):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.sync = threading.Barrier(size, timeout=timeout)
        self.slots = [None] * size
        self.calls = [[] for _ in range(size)]  # (name, dtype, len(send)) per rank

    def _exchange(self, rank, name, send, recv):
        self.calls[rank].append((name, send.dtype, len(send)))
        assert isinstance(send, np.ndarray) and recv.flags.writeable
        assert send is recv or not send.flags.writeable
        self.slots[rank] = np.array(send)
        self.barrier.wait()
        everything = list(self.slots)
        self.barrier.wait()
        return everything

    def callbacks(self, rank):
        reduce = {"sum": lambda arrays: np.sum(arrays, axis=0, dtype=arrays[0].dtype),
                  "max": lambda arrays: np.max(arrays, axis=0)}

        def allreduce(send, recv, op):
            recv[:] = reduce[op](self._exchange(rank, "allreduce", send, recv))

        def reduce_scatter(send, recv, op):
            total = reduce[op](self._exchange(rank, "reduce_scatter", send, recv))
            recv[:] = np.split(total, self.size)[rank]

        def allgather(send, recv):
            recv[:] = np.concatenate(self._exchange(rank, "allgather", send, recv))

        def alltoall(send, recv):
            everything = self._exchange(rank, "alltoall", send, recv)
            recv[:] = np.concatenate([np.split(a, self.size)[rank] for a in everything])

        return {"allreduce": allreduce, "reduce_scatter": reduce_scatter,
                "allgather": allgather, "alltoall": alltoall}

    def communicator(self, rank, wrap=None):
        callbacks = self.callbacks(rank)
        if wrap is not None:
            callbacks = wrap(rank, callbacks)
        return dsopt.Communicator.from_callbacks(rank, self.size, **callbacks)

    def run(self, target, timeout=60):
        """target(rank) on a thread per rank; their results, or raises the
        first exception; fails the test when a rank does not finish."""
        results, errors = [None] * self.size, [None] * self.size

        def body(rank):
            try:
                results[rank] = target(rank)
            except BaseException as exc:  # noqa: B902 - reported below
                errors[rank] = exc
                self.barrier.abort()
                self.sync.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        hung = [r for r, t in enumerate(threads) if t.is_alive()]
        assert not hung, f"ranks {hung} did not finish within {timeout} s"
        for error in errors:
            if error is not None:
                raise error
        return results


def gradients(rank, step):
    rng = np.random.default_rng([rank, step])
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def initial_params():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def train(config, comm, rank, steps=6, grads=gradients):
    params = initial_params()
    infos = []
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for step in range(steps):
            infos.append(opt.step(grads(rank, step)))
    return params, infos


# ---- one rank ----------------------------------------------------------------------


def single_rank_callbacks(calls):
    def allreduce(send, recv, op):
        calls.append("allreduce")
        recv[:] = send

    def reduce_scatter(send, recv, op):
        calls.append("reduce_scatter")
        recv[:] = send

    def allgather(send, recv):
        calls.append("allgather")
        recv[:] = send

    def alltoall(send, recv):
        calls.append("alltoall")
        recv[:] = send

    return {"allreduce": allreduce, "reduce_scatter": reduce_scatter,
            "allgather": allgather, "alltoall": alltoall}


@pytest.mark.parametrize("config", [ADAMW, ONEBIT], ids=["AdamW", "OneBitAdam"])
def test_world_of_one_trains_bit_identically_to_a_local_communicator(config):
    calls = []
    with dsopt.Communicator.from_callbacks(0, 1, **single_rank_callbacks(calls)) as comm:
        assert (comm.rank, comm.size, comm.kind) == (0, 1, "callbacks")
        ours, infos = train(config, comm, 0)
        assert comm.callback_error is None
    with dsopt.Communicator.local() as local:
        theirs, local_infos = train(config, local, 0)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    assert [i.compressed for i in infos] == [i.compressed for i in local_infos]


def test_callables_stay_referenced_until_dsopt_releases_them():
    class Callback:
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *args):
            return self.fn(*args)

    calls = []
    callbacks = {k: Callback(v) for k, v in single_rank_callbacks(calls).items()}
    ref = weakref.ref(callbacks["allgather"])
    live_before = len(_callback_comm._LIVE)
    comm = dsopt.Communicator.from_callbacks(0, 1, **callbacks)
    del callbacks
    gc.collect()
    assert ref() is not None
    opt = dsopt.Optimizer(ADAMW, initial_params(), comm=comm)
    comm.close()  # deferred: the optimizer still uses it
    gc.collect()
    assert ref() is not None and not comm.closed
    opt.step(gradients(0, 0))
    opt.close()  # the last user: dsopt_comm_destroy, which calls release
    assert comm.closed
    gc.collect()
    assert ref() is None
    assert len(_callback_comm._LIVE) == live_before


def test_arguments_are_checked():
    callbacks = single_rank_callbacks([])
    with pytest.raises(TypeError, match="alltoall must be callable"):
        dsopt.Communicator.from_callbacks(0, 1, **dict(callbacks, alltoall=None))
    with pytest.raises(TypeError, match="rank must be an int"):
        dsopt.Communicator.from_callbacks(0.0, 1, **callbacks)
    with pytest.raises(dsopt.InvalidArgument, match="buffers"):
        dsopt.Communicator.from_callbacks(0, 1, buffers="cupy", **callbacks)
    live_before = len(_callback_comm._LIVE)
    for rank, size in ((1, 1), (-1, 2), (0, 0)):
        with pytest.raises(dsopt.InvalidArgument):
            dsopt.Communicator.from_callbacks(rank, size, **callbacks)
    assert len(_callback_comm._LIVE) == live_before  # nothing kept for a rejected table


# ---- ranks on threads -----------------------------------------------------------------


@pytest.mark.parametrize("config", [ADAMW, ONEBIT], ids=["AdamW", "OneBitAdam"])
@pytest.mark.parametrize("size", [2, 3])
def test_thread_ranks_end_with_the_same_parameters(config, size):
    world = ThreadWorld(size)

    def rank_main(rank):
        with world.communicator(rank) as comm:
            return train(config, comm, rank)

    results = world.run(rank_main)
    for params, _ in results[1:]:
        for a, b in zip(params, results[0][0]):
            np.testing.assert_array_equal(a, b)
    infos = results[0][1]
    assert all(i.bytes_sent > 0 for i in infos)
    if config is ONEBIT:
        assert [i.compressed for i in infos] == [False, False, True, True, True, True]
    # host buffers only, and no floating-point reductions through the callbacks
    for rank_calls in world.calls:
        for name, dtype, _ in rank_calls:
            if name in ("allreduce", "reduce_scatter"):
                assert dtype.kind in "iu", (name, dtype)


def test_two_thread_ranks_match_one_rank_on_the_mean_gradient():
    """With two ranks the mean of two float32 values is exact to round
    once, so AdamW on two ranks equals AdamW on one with the mean."""
    world = ThreadWorld(2)

    def rank_main(rank):
        with world.communicator(rank) as comm:
            return train(ADAMW, comm, rank)

    (params, _), _ = world.run(rank_main)

    def mean(_, step):
        return [(a + b) / np.float32(2) for a, b in zip(gradients(0, step), gradients(1, step))]

    reference, _ = train(ADAMW, None, 0, grads=mean)
    for a, b in zip(params, reference):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_exception_in_one_ranks_callback_fails_every_rank_with_comm_error():
    world = ThreadWorld(2)
    failure = KeyError("injected failure on rank 0")

    def failing(rank, callbacks):
        if rank != 0:
            return callbacks
        calls = {"n": 0}

        def wrapped(name):
            inner = callbacks[name]

            def call(*args):
                calls["n"] += 1
                if calls["n"] > armed["after"]:
                    raise failure
                return inner(*args)

            return call

        return {name: wrapped(name) for name in callbacks}

    armed = {"after": 10 ** 9}
    outcome = [None, None]

    def rank_main(rank):
        comm = world.communicator(rank, wrap=failing)
        opt = dsopt.Optimizer(ADAMW, initial_params(), comm=comm)
        opt.step(gradients(rank, 0))
        world.sync.wait()
        armed["after"] = 0  # rank 0's next collective raises
        world.sync.wait()
        try:
            opt.step(gradients(rank, 1))
        except dsopt.CommError as error:
            outcome[rank] = (error, comm.callback_error)
            if rank == 0:
                world.barrier.abort()  # what a timeout does for the peer of a failed rank
        finally:
            opt.close()
            comm.close()

    world.run(rank_main)
    (error0, cause0), (error1, cause1) = outcome
    assert error0.status == dsopt.lib.DSOPT_ECOMM
    assert "injected failure on rank 0" in str(error0) and "KeyError" in str(error0)
    assert cause0 is failure
    assert isinstance(cause1, threading.BrokenBarrierError)
    assert "BrokenBarrierError" in str(error1)


def test_communicator_is_not_called_again_after_a_failure():
    calls = []
    callbacks = single_rank_callbacks(calls)
    world = ThreadWorld(2)

    def rank_main(rank):
        own = world.callbacks(rank)
        fail = {"on": False}

        def guard(name):
            def call(*args):
                calls.append((rank, name, fail["on"]))
                if fail["on"]:
                    raise RuntimeError("down")
                return own[name](*args)
            return call

        comm = dsopt.Communicator.from_callbacks(rank, 2, **{n: guard(n) for n in callbacks})
        with comm, dsopt.Optimizer(ADAMW, initial_params(), comm=comm) as opt:
            opt.step(gradients(rank, 0))
            world.sync.wait()
            fail["on"] = True
            for _ in range(2):
                with pytest.raises(dsopt.CommError):
                    opt.step(gradients(rank, 1))

    world.run(rank_main)
    for rank in (0, 1):
        assert [c for c in calls if c[0] == rank and c[2]].__len__() == 1, calls


@pytest.mark.parametrize("concurrent", [False, True], ids=["plain", "concurrent"])
def test_handed_over_gradients_step_like_a_whole_step(concurrent):
    """grad_ready (last tensor first, as backward produces them) then
    step(): bit for bit the step with all gradients at once. With
    concurrent=True dsopt may call the callables from a thread of its own
    while this one hands over the next gradients."""
    config = ADAMW
    world = ThreadWorld(2)

    def rank_main(rank):
        callbacks = world.callbacks(rank)
        comm = dsopt.Communicator.from_callbacks(rank, 2, concurrent=concurrent, **callbacks)
        params = initial_params()
        with comm, dsopt.Optimizer(config, params, comm=comm) as opt:
            for step in range(4):
                grads = gradients(rank, step)
                for i in reversed(range(len(grads))):
                    opt.grad_ready(i, grads[i])
                opt.step()
        return params

    handed_over = world.run(rank_main)
    whole_world = ThreadWorld(2)

    def whole(rank):
        with whole_world.communicator(rank) as comm:
            return train(config, comm, rank, steps=4)[0]

    reference = whole_world.run(whole)
    for rank in (0, 1):
        for a, b in zip(handed_over[rank], reference[rank]):
            np.testing.assert_array_equal(a, b)


def test_set_nodes_checks_its_arguments():
    """dsopt_comm_set_nodes: both or neither, two others than the
    communicator, sizes that make its world (DSOPT_EINVAL); a world of one
    given itself as one node of one rank runs as before."""
    comm, node, rail = (dsopt.Communicator.local() for _ in range(3))
    with pytest.raises(dsopt.InvalidArgument, match="both"):
        comm.set_nodes(node, None)
    with pytest.raises(dsopt.InvalidArgument, match="other than comm"):
        comm.set_nodes(comm, rail)
    with pytest.raises(dsopt.InvalidArgument, match="other than comm"):
        comm.set_nodes(node, node)
    with pytest.raises(dsopt.InvalidArgumentType):
        comm.set_nodes(node, "rail")
    assert comm.nodes is None
    comm.set_nodes(node, rail)
    assert comm.nodes == (node, rail)
    node.close()  # waits for comm
    assert not node.closed
    config = {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 1}},
              "topology": {"hierarchy": "node_aware"}}
    with dsopt.Optimizer(config, [np.ones(10, np.float32)], comm=comm) as opt:
        for _ in range(3):
            opt.step([np.ones(10, np.float32)])
    comm.set_nodes(None, None)
    assert comm.nodes is None and node.closed and not rail.closed
    comm.close()
    rail.close()
