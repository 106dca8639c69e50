"""``dsopt.torch.ddp_comm_hook``: the DistributedDataParallel communication
hook that leaves the reduction of gradients to dsopt."""

import torch


def ddp_comm_hook(state, bucket):
    """A DDP communication hook that reduces nothing: each bucket's local
    gradients go back into ``.grad`` unchanged, so that the dsopt.torch
    optimizer's own reduction (plain, 1-bit compressed or ZeRO's
    reduce-scatter) is the only one. Register it on the wrapped model::

        ddp_model = torch.nn.parallel.DistributedDataParallel(model)
        ddp_model.register_comm_hook(None, dsopt.torch.ddp_comm_hook)

    Without it DDP allreduces every fp32 gradient and dsopt averages the
    (then equal) gradients a second time: the same result for twice the
    traffic, and none of 1-bit compression's savings. With it, ``.grad``
    after backward holds this rank's gradient, not the average: clip with
    dsopt's ``gradient_clipping`` (or ``max_grad_norm`` of
    ``dsopt.hf.Trainer``), not with ``clip_grad_norm_`` on ``.grad``.
    ``state`` is unused (pass None)."""
    del state
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
