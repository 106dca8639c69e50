"""dsopt.torch with ``overlap=True`` against ``overlap=False``: the model,
data and training loop of test_torch_overlap.py, and its 4-rank run under
``mpirun -np 4`` (phase "overlap"; every check is made on the ranks).

With torch >= 2.1 overlap=True hands each gradient over from a
post-accumulate-grad hook during backward; with older torch it hands the
``.grad`` over in ``step()`` (the fallback), which the same checks cover.

Gradient accumulation: with overlap each backward pass hands over its own
micro-batch gradient of the unscaled loss and dsopt averages the G of them
(``"gradient_accumulation_steps"``); the reference without overlap
accumulates ``.grad`` over G backward passes of the loss divided by G, as
usual in torch. Dividing by G = 2 is exact, so the two agree bit for bit
wherever dsopt sums the micro-batches before reducing them (one rank, and
ZeRO stage 0 and 1); stage 2 reduces every micro-batch and sums the reduced
shards, which on several ranks rounds differently."""

import sys
import warnings

import torch

import dsopt
import dsopt.torch

ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 0.01}}}
ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}
# Small buckets: the reductions run in several pieces that split tensors.
ZERO = {"reduce_bucket_size": 40, "allgather_bucket_size": 24}


def zero(config, stage, **top):
    out = dict(config, zero_optimization=dict(ZERO, stage=stage))
    out.update(top)
    return out


class Net(torch.nn.Module):
    """A small MLP, plus a head used only on even steps: on odd steps its
    parameters get no gradient (zeros, with and without overlap)."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 1))
        self.extra = torch.nn.Linear(8, 1)

    def forward(self, x, step):
        out = self.body(x)
        if step % 2 == 0:
            out = out + 0.1 * self.extra(x)
        return out


def batch(step, micro=0, rank=0):
    gen = torch.Generator().manual_seed(1000 + 97 * rank + 13 * micro + step)
    x = torch.randn(16, 8, generator=gen)
    y = 0.3 * (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:].sum(dim=1, keepdim=True))
    return x, y


def train(model, opt, steps, micro_batches=1, loss_scale=1.0, rank=0, check_grads=None):
    """``steps`` steps of ``micro_batches`` backward passes each; the loss
    of every micro-batch is multiplied by ``loss_scale``. ``check_grads``
    is called after every backward pass."""
    losses = []
    for step in range(steps):
        opt.zero_grad()
        for micro in range(micro_batches):
            x, y = batch(step, micro, rank)
            loss = torch.nn.functional.mse_loss(model(x, step), y)
            (loss * loss_scale).backward()
            if check_grads is not None:
                check_grads(model)
            losses.append(float(loss.detach()))
        opt.step()
    return losses


def make(config, overlap, comm=None, seed=0):
    model = Net(seed)
    with warnings.catch_warnings():
        # torch < 2.1: overlap=True warns once and reads .grad in step().
        warnings.simplefilter("ignore", RuntimeWarning)
        opt = dsopt.torch.Optimizer(model.parameters(), config, comm, overlap=overlap)
    return model, opt


def run(config, overlap, steps=4, micro_batches=1, comm=None, rank=0, reference_config=None):
    """Parameters after ``steps`` steps. overlap=False runs
    ``reference_config`` (default ``config``) with the loss divided by
    ``micro_batches``."""
    if not overlap:
        config = reference_config or config
    model, opt = make(config, overlap, comm)
    scale = 1.0 if overlap else 1.0 / micro_batches
    train(model, opt, steps, micro_batches, scale, rank)
    info = opt.last_step_info
    opt.close()
    assert info.step == steps and not info.skipped, info
    return [p.detach().clone() for p in model.parameters()], info


def without_accumulation(config):
    return {k: v for k, v in config.items() if k != "gradient_accumulation_steps"}


def differences(a, b):
    """Indices of the parameters whose bits differ."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if not torch.equal(x, y)]


def phase_overlap(comm, rank, size):
    checked = 0
    for stage in (0, 1, 2):
        for config in (zero(ADAM, stage), zero(ADAMW, stage, gradient_clipping=0.05)):
            for g in (1, 2):
                cfg = dict(config, gradient_accumulation_steps=g) if g > 1 else config
                got, info = run(cfg, True, micro_batches=g, comm=comm, rank=rank)
                want, want_info = run(cfg, False, micro_batches=g, comm=comm, rank=rank,
                                      reference_config=without_accumulation(cfg))
                what = f"stage {stage}, {cfg['optimizer']['type']}, G={g}, P={size}"
                if g == 1 or stage < 2 or size == 1:
                    assert not differences(got, want), f"{what}: {differences(got, want)} differ"
                    assert info.grad_norm == want_info.grad_norm, (what, info, want_info)
                else:
                    for x, y in zip(got, want):
                        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=what)
                checked += 1
    return checked


def run_with_silent_rank(config, overlap, comm, rank, size, steps=4, silent=(0, 2)):
    """Parameters after ``steps`` steps in which the last rank runs no
    backward pass at the steps ``silent`` (it hands nothing over, or its
    .grad stays as zero_grad left it)."""
    model, opt = make(config, overlap, comm)
    for step in range(steps):
        opt.zero_grad()
        if not (rank == size - 1 and step in silent):
            x, y = batch(step, 0, rank)
            torch.nn.functional.mse_loss(model(x, step), y).backward()
        opt.step()
    info = opt.last_step_info
    opt.close()
    assert info.step == steps and not info.skipped, info
    return [p.detach().clone() for p in model.parameters()], info


def phase_silent_rank(comm, rank, size):
    """overlap=True with a rank that handed nothing over in a step: every
    rank still completes the step with the same collective call, and the
    parameters are those of overlap=False (the silent rank contributes
    zeros)."""
    checked = 0
    for config in (ADAM, zero(ADAMW, 1), zero(ADAMW, 2, gradient_clipping=0.05)):
        got, info = run_with_silent_rank(config, True, comm, rank, size)
        want, want_info = run_with_silent_rank(config, False, comm, rank, size)
        assert not differences(got, want), (config, differences(got, want))
        assert info.grad_norm == want_info.grad_norm, (config, info, want_info)
        checked += 1
    return checked


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"overlap": phase_overlap, "silent_rank": phase_silent_rank}))
