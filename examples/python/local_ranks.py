"""Ranks on this machine without a launcher: ``spawn(fn, procs, *args)``
runs ``fn(*args)`` in ``procs`` processes (torch.multiprocessing) with the
variables torchrun would set (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free port of 127.0.0.1), for the examples' ``--spawn`` /
``--procs`` options."""

import os
import socket

import torch.multiprocessing


def free_port() -> int:
    """A free TCP port of 127.0.0.1 for the rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank, world, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    fn(*args)


def spawn(fn, procs: int, *args):
    """``fn(*args)`` on ranks 0 .. procs-1; returns when all have ended
    (torch.multiprocessing.spawn raises on the first failure)."""
    torch.multiprocessing.spawn(_run, args=(procs, free_port(), fn, args), nprocs=procs)
