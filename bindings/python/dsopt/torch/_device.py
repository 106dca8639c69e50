"""The CUDA device of a dsopt.torch optimizer: dsopt creates an optimizer
on the current CUDA device, and a ``from_torch`` communicator wraps dsopt's
device buffers as tensors of its own device, so both are made with the
parameters' device current and the communicator is checked against it
before anything is created."""

import contextlib

import torch


def cuda_device(tensors):
    """The torch.device of the first parameter when it is on CUDA, else None."""
    return tensors[0].device if tensors and tensors[0].is_cuda else None


def current(device):
    """The context in which dsopt, which works on the current CUDA device,
    creates an optimizer for tensors on ``device`` (None or a CPU device:
    nothing to change)."""
    if device is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def bind_comm(comm, device):
    """Tells a ``from_torch`` communicator that its optimizer's parameters
    are on ``device`` (a CUDA torch.device); ValueError, before anything is
    created or sent, when the communicator works on another device."""
    if comm is None or device is None or device.type != "cuda":
        return
    collectives = comm.torch_collectives
    if collectives is not None:
        collectives.bind_device(device)
