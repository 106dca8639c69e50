"""The residuals of a compression as a checkpoint: ``state_dict`` /
``load_state_dict`` (and so a ``torch.distributed.checkpoint`` Stateful).

Each module's residual is this rank's own (P runs of int8 codes, bytes);
in a state dict it is a DTensor over the module's mesh, sharded on every
mesh dimension, so that torch.distributed.checkpoint saves every rank's
part (a plain tensor would be taken for a replicated one and saved once).
Its global shape, mesh shape + (bytes,), ties it to the world size and
mesh: a residual loads into the same layout only (elsewhere leave it out of
the load: the residuals then start from zero, as compressed ZeRO's do at
another world size)."""

from torch.distributed.tensor import DTensor, Shard

FORMAT = 1


def _as_dtensor(residual, mesh):
    dims = mesh.ndim
    local = residual.view((1,) * dims + (residual.numel(),))
    shape = tuple(mesh.shape) + (residual.numel(),)
    stride = []
    step = 1
    for size in reversed(shape):
        stride.insert(0, step)
        step *= size
    return DTensor.from_local(local, mesh, [Shard(i) for i in range(dims)], run_check=False,
                              shape=shape, stride=tuple(stride))


def state_dict(settings, entries):
    """settings: the codec's {"gradients", "gradient_block_size"}; entries:
    (state key, residual tensor, mesh) of every module with a residual."""
    return {"format": FORMAT, **settings,
            "residuals": {key: _as_dtensor(residual, mesh) for key, residual, mesh in entries}}


def _local(value, key, residual):
    local = value.to_local() if isinstance(value, DTensor) else value
    if local.numel() != residual.numel():
        raise ValueError(
            f"dsopt.torch.fsdp: the residual of {key!r} holds {local.numel()} bytes, this rank's has "
            f"{residual.numel()}: it was saved at another world size, mesh or module layout (leave "
            "the compression out of the load there: its residuals start again from zero)")
    return local.reshape(-1)


def load_state_dict(settings, entries, state):
    """Copies the residuals of ``state`` into ``entries``' tensors after
    checking all of it: on any mismatch nothing changes."""
    if state.get("format") != FORMAT:
        raise ValueError(f"dsopt.torch.fsdp: not a compression state (format {state.get('format')!r}, "
                         f"this version reads {FORMAT})")
    for name, value in settings.items():
        if state.get(name) != value:
            raise ValueError(f"dsopt.torch.fsdp: the state was saved with {name}={state.get(name)!r}, "
                             f"this compression has {value!r}")
    saved = dict(state.get("residuals", {}))
    mine = {key for key, _, _ in entries}
    if set(saved) != mine:
        raise ValueError(f"dsopt.torch.fsdp: the state has residuals for {sorted(saved)}, this "
                         f"compression for {sorted(mine)}")
    copies = [(residual, _local(saved[key], key, residual)) for key, residual, _ in entries]
    for residual, local in copies:
        residual.copy_(local)
