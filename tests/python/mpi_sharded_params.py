"""Run under ``mpirun -np 2`` or ``-np 4`` (test_sharded_params.py):
dsopt optimizers on sharded parameters (``dsopt_comm_set_shards``), as
FSDP shards a model. Every tensor is cut into row blocks as torch.chunk
cuts dim 0 (uneven, one rank's block of a one-row tensor empty); the
gradients each rank passes are its blocks of gradients already reduced
over the shard group. Phases (``$DSOPT_TEST_PHASES``):

* np 2, ``whole`` (the main communicator local, the shards over the
  world): AdamW equals AdamW of whole tensors bit for bit, clipped too
  (grad_norm to 1e-12); LAMB equals the numpy reference of whole tensors
  (tests/python/lamb_reference.py) within the rounding of its norms' order;
* np 2, ``agree``: a non-finite gradient in one rank's shard skips the step
  on both; a gradient of the wrong size on one rank fails both (its own
  error there, dsopt.Mismatch on the other) and changes nothing; configs
  or parameter counts that differ fail both at creation, ZeRO is refused;
* np 2, ``without``: DSOPT_LOAD_WITHOUT_RANK_LOCAL (a blob whose
  rank-local sections are empty loads and resets them, and fails without
  the flag);
* np 4, ``hsdp`` (2 replicas x 2 shards): 1-bit LAMB and 1-bit Adam, clipped,
  over the replicas, equal the same optimizer over whole tensors on the
  replica communicator during warmup (to the rounding of the norms), then
  compress with both replicas of a shard bit-identical; a bad gradient on
  one rank fails the step on all four.
"""

import struct
import sys
import warnings
import zlib

import numpy as np

import dsopt
from lamb_reference import LambReference
from mpi_phases import main

SHAPES = [(5, 3), (1, 4), (7,), (3, 2)]


def rows(shape, shards, s):
    """Rank ``s``'s block of rows of a tensor of ``shape`` (torch.chunk)."""
    n = shape[0]
    per = -(-n // shards)
    return min(s * per, n), min((s + 1) * per, n)


def shard_of(x, shards, s):
    a, b = rows(x.shape, shards, s)
    return np.ascontiguousarray(x[a:b])


def whole_params(seed=7):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def whole_grads(step, replica=0, scale=3.0):
    rng = np.random.default_rng(1000 + 17 * step + replica)
    return [(scale * rng.standard_normal(shape)).astype(np.float32) for shape in SHAPES]


def sharded_comm(shards):
    main_comm = dsopt.Communicator.local()
    main_comm.set_shards(shards)
    return main_comm


def run_sharded(config, shard_comm, s, steps, grads_of=whole_grads, replicas=None, replica=0):
    """(this rank's shards after ``steps`` steps, step infos)."""
    shards = shard_comm.size
    params = [shard_of(p, shards, s) for p in whole_params()]
    main_comm = replicas if replicas is not None else dsopt.Communicator.local()
    main_comm.set_shards(shard_comm)
    infos = []
    with dsopt.Optimizer(config, params, comm=main_comm) as opt:
        for k in range(steps):
            infos.append(opt.step([shard_of(g, shards, s) for g in grads_of(k, replica)]))
    main_comm.set_shards(None)
    if replicas is None:
        main_comm.close()
    return params, infos


def run_whole(config, steps, comm=None, replica=0):
    params = whole_params()
    infos = []
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for k in range(steps):
            infos.append(opt.step(whole_grads(k, replica)))
    return params, infos


def adamw(**top):
    return dict({"optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}, **top)


def phase_whole(comm, rank, size):
    for top in ({}, {"gradient_clipping": 1.0}):
        config = adamw(**top)
        mine, infos = run_sharded(config, comm, rank, 4)
        whole, whole_infos = run_whole(config, 4)
        for p, w in zip(mine, whole):
            assert np.array_equal(p, shard_of(w, size, rank)), (top, np.abs(p - shard_of(w, size, rank)).max())
        for a, b in zip(infos, whole_infos):
            assert abs(a.grad_norm - b.grad_norm) <= 1e-12 * max(1.0, abs(b.grad_norm)), (a, b)
            assert not a.skipped
    if top:
        assert whole_infos[0].grad_norm > 1.0  # the clipping binds
    config = {"optimizer": {"type": "Lamb", "params": {"lr": 5e-2, "weight_decay": 0.01}},
              "gradient_clipping": 2.0}
    mine, _ = run_sharded(config, comm, rank, 5)
    ref = LambReference(config, whole_params(), 1)
    for k in range(5):
        ref.step([whole_grads(k)])
    for p, w, shape in zip(mine, ref.params(), SHAPES):
        expect = shard_of(np.asarray(w).reshape(shape), size, rank)
        assert np.allclose(p, expect, rtol=2e-6, atol=2e-6), np.abs(p - expect).max()
    return "adamw, lamb"


def expect_error(kind, fn, *patterns):
    try:
        fn()
    except kind as error:
        text = str(error)
        assert all(p in text for p in patterns), text
        return text
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def phase_agree(comm, rank, size):
    config = adamw()
    params = [shard_of(p, size, rank) for p in whole_params()]
    main_comm = sharded_comm(comm)
    with dsopt.Optimizer(config, params, comm=main_comm) as opt:
        opt.step([shard_of(g, size, rank) for g in whole_grads(0)])
        before = [p.copy() for p in params]
        grads = [shard_of(g, size, rank) for g in whole_grads(1)]
        if rank == 1:
            grads[0][0, 0] = np.inf
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
            info = opt.step(grads)
        assert info.skipped, info
        assert all(np.array_equal(a, b) for a, b in zip(before, params))
        grads = [shard_of(g, size, rank) for g in whole_grads(2)]
        if rank == 1:
            grads[2] = np.zeros(1, np.float32)
            expect_error(dsopt.InvalidArgument, lambda: opt.step(grads), "grads[2].numel")
        else:
            expect_error(dsopt.Mismatch, lambda: opt.step(grads), "another rank failed", "rank 1")
        assert all(np.array_equal(a, b) for a, b in zip(before, params))
        info = opt.step([shard_of(g, size, rank) for g in whole_grads(2)])
        assert not info.skipped and info.step == 2
    # Configs and parameter counts the shard group disagrees on; ZeRO.
    lr = 1e-2 if rank == 0 else 2e-2
    other = {"optimizer": {"type": "AdamW", "params": {"lr": lr}}}
    expect_error(dsopt.Mismatch, lambda: dsopt.Optimizer(other, params, comm=main_comm), "config")
    fewer = params if rank == 0 else params[:-1]
    expect_error(dsopt.Mismatch, lambda: dsopt.Optimizer(config, fewer, comm=main_comm),
                 "number of parameters")
    zero = dict(config, zero_optimization={"stage": 1})
    expect_error(dsopt.Unsupported, lambda: dsopt.Optimizer(zero, params, comm=main_comm),
                 "dsopt_comm_set_shards")
    main_comm.set_shards(None)
    main_comm.close()
    return "skip, bad grads, create"


def phase_hsdp(comm, rank, size):
    from mpi4py import MPI
    world_comm = MPI.COMM_WORLD
    replica, s = rank // 2, rank % 2
    shard_comm = dsopt.Communicator.from_mpi4py(world_comm.Split(replica, s))
    replicas = dsopt.Communicator.from_mpi4py(world_comm.Split(s, replica))
    for opt_type in ("OneBitLamb", "OneBitAdam"):
        config = {"optimizer": {"type": opt_type,
                                "params": {"lr": 2e-2, "freeze_step": 3, "weight_decay": 0.01}},
                  "gradient_clipping": 2.0}
        steps = 6
        mine, infos = run_sharded(config, shard_comm, s, steps, replicas=replicas, replica=replica)
        warm = sum(1 for i in infos if not i.compressed)
        assert 2 <= warm < steps and all(np.isfinite(p).all() for p in mine), (opt_type, warm)
        # During warmup: as the whole tensors on the replica communicator.
        early, _ = run_sharded(config, shard_comm, s, warm, replicas=replicas, replica=replica)
        whole, _ = run_whole(config, warm, comm=replicas, replica=replica)
        for p, w in zip(early, whole):
            expect = shard_of(w, 2, s)
            assert np.allclose(p, expect, rtol=1e-5, atol=1e-6), (opt_type, np.abs(p - expect).max())
        # Compressing: both replicas of a shard hold the same values.
        for p in mine:
            other = np.empty_like(p)
            replicas_peer = world_comm.Split(s, replica)
            replicas_peer.Sendrecv(p, dest=1 - replica, recvbuf=other, source=1 - replica)
            replicas_peer.Free()
            assert np.array_equal(p, other), opt_type
    # A bad gradient on one rank fails the step on all four (its shard group
    # learns of it first, then every replica), changing nothing.
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
    params = [shard_of(p, 2, s) for p in whole_params()]
    replicas.set_shards(shard_comm)
    with dsopt.Optimizer(config, params, comm=replicas) as opt:
        opt.step([shard_of(g, 2, s) for g in whole_grads(0, replica)])
        before = [p.copy() for p in params]
        grads = [shard_of(g, 2, s) for g in whole_grads(1, replica)]
        if rank == 3:
            grads[0] = np.zeros(1, np.float32)
            expect_error(dsopt.InvalidArgument, lambda: opt.step(grads), "grads[0].numel")
        else:
            expect_error(dsopt.Mismatch, lambda: opt.step(grads), "another rank")
        assert all(np.array_equal(a, b) for a, b in zip(before, params))
        info = opt.step([shard_of(g, 2, s) for g in whole_grads(1, replica)])
        assert not info.skipped and info.step == 2
    replicas.set_shards(None)
    shard_comm.close()
    replicas.close()
    return "onebit lamb, onebit adam, bad gradients"


def without_rank_local(blob, names):
    """``blob`` (src/state/blob.hpp's layout) with the sections ``names``
    empty, the checksum made again."""
    data = bytes(blob)
    pos = 24
    (n,) = struct.unpack_from("<I", data, pos)
    pos += 4 + n + 8
    (count,) = struct.unpack_from("<Q", data, pos)
    pos += 8 + 16 * count
    out = [data[24:pos + 4]]
    (nsections,) = struct.unpack_from("<I", data, pos)
    pos += 4
    for _ in range(nsections):
        (n,) = struct.unpack_from("<I", data, pos)
        name = data[pos + 4:pos + 4 + n]
        (size,) = struct.unpack_from("<Q", data, pos + 4 + n)
        body = data[pos + 4 + n + 8:pos + 4 + n + 8 + size]
        if name.decode() in names:
            body = b""
        out += [struct.pack("<I", n), name, struct.pack("<Q", len(body)), body]
        pos += 4 + n + 8 + size
    body = b"".join(out)
    head = data[:8] + struct.pack("<IIQ", 1, 0, 24 + len(body) + 4)
    return head + body + struct.pack("<I", zlib.crc32(head + body))


def phase_without(comm, rank, size):
    """DSOPT_LOAD_WITHOUT_RANK_LOCAL: a compressing 1-bit Adam's blob with its
    errors left empty loads with the flag (errors reset: the next step is a
    fresh optimizer's given the same moments), and without it fails on
    every rank, changing nothing."""
    config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-2, "freeze_step": 2}}}
    params = whole_params()
    with dsopt.Optimizer(config, params, comm=comm) as opt:
        for k in range(4):
            opt.step(whole_grads(k, rank))
        blob = opt.state_dict()
        empty = without_rank_local(blob, {"onebit.worker_error", "onebit.server_error"})
        before = [p.copy() for p in params]
        expect_error((dsopt.CorruptState, dsopt.Mismatch), lambda: opt.load_state_dict(empty),
                     "worker_error")
        assert all(np.array_equal(a, b) for a, b in zip(before, params))
        assert opt.load_state_dict(empty, without_rank_local=True) is True
        opt.step(whole_grads(4, rank))
        reset_params = [p.copy() for p in params]
        # the same as loading the whole blob and resetting it
        for p, b in zip(params, before):
            p[...] = b
        assert opt.load_state_dict(blob, without_rank_local=True) is True
        opt.step(whole_grads(4, rank))
        assert all(np.array_equal(a, b) for a, b in zip(reset_params, params))
        for p, b in zip(params, before):
            p[...] = b
        opt.load_state_dict(blob)  # errors kept: another step
        opt.step(whole_grads(4, rank))
        assert not all(np.array_equal(a, b) for a, b in zip(reset_params, params))
    return "errors reset"


PHASES = {"whole": phase_whole, "agree": phase_agree, "hsdp": phase_hsdp, "without": phase_without}


if __name__ == "__main__":
    sys.exit(main(PHASES))
