"""dsopt.torch with ``overlap=True`` under ZeRO stage 1/2: ``step()``
returns with the parameter allgather in flight (``"deferred_allgather"``)
and each module's forward pre-hook waits for its parameters' bucket. The
parameters, the losses, an evaluation under ``no_grad``, ``model.state_dict()``
and the optimizer's ``state_dict()`` taken between steps are those of
``overlap=False`` bit for bit (fp32, bf16, compressed ZeRO). A model whose
layers are registered in the reverse of their forward order has its
forward order handed to dsopt, its first layer's bucket gathered first,
and the same values again (phase "order"). Run by test_torch_prefetch.py
in one process and under ``mpirun -np 2`` and ``-np 4`` (phases
"prefetch" and "order")."""

import sys
import warnings

import torch

import dsopt
import dsopt.torch

ADAMW = {"optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}}


def zero(stage, bucket=24, **more):
    z = dict(stage=stage, reduce_bucket_size=40, **more)
    if bucket is not None:
        z["allgather_bucket_size"] = bucket
    return dict(ADAMW, zero_optimization=z)


CONFIGS = {
    "zero1": zero(1),
    "zero2": zero(2),
    "zero2 default bucket": zero(2, bucket=None),
    "zero2 compressed": zero(2, compression={"parameters": "bf16", "gradients": "int8"}),
    "zero1 compressed int8": zero(1, bucket=64, compression={"parameters": "int8",
                                                             "parameter_block_size": 16}),
    "zero2 compressed int8 default bucket": zero(2, bucket=None, compression={"parameters": "int8"}),
}


class Net(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 16), torch.nn.Tanh(),
                                        torch.nn.Linear(16, 1))
        self.to(dtype)

    def forward(self, x):
        return self.body(x)


class ReversedNet(torch.nn.Module):
    """Layers registered in the reverse of their forward order (parameter
    order is the reverse of the forward's), and one that forward never
    uses (its parameters go last in the recorded order)."""

    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.unused = torch.nn.Linear(2, 2)
        self.l4 = torch.nn.Linear(16, 1)
        self.l3 = torch.nn.Linear(16, 16)
        self.l2 = torch.nn.Linear(2, 16)
        self.l1 = torch.nn.Linear(8, 2)
        self.to(dtype)

    def forward(self, x):
        return self.l4(torch.tanh(self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))))


# The reversed net's configs. "one reduce bucket": the shards are contiguous
# slices, and with chunks of 128 / P elements l1.weight lies in one chunk
# at 2 and 4 ranks (the last of 3 in parameter order).
ORDER_CONFIGS = {
    "zero2 one reduce bucket": dict(ADAMW, zero_optimization={"stage": 2, "allgather_bucket_size": 128}),
    "zero1": zero(1),
    "zero2 compressed": zero(2, compression={"parameters": "bf16", "gradients": "int8"}),
    "zero1 compressed int8": zero(1, bucket=64, compression={"parameters": "int8",
                                                             "parameter_block_size": 16}),
}


def batch(step, rank, dtype):
    gen = torch.Generator().manual_seed(1000 + 97 * rank + step)
    x = torch.randn(16, 8, generator=gen)
    y = 0.3 * (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:].sum(dim=1, keepdim=True))
    return x.to(dtype), y.to(dtype)


def run(config, overlap, dtype, comm=None, rank=0, steps=5, net=Net, record=True, buckets=None):
    """What a run shows: the losses, and after every step an evaluation
    under no_grad, model.state_dict() and the optimizer's blob, in turn.
    ``record`` False: the forward order is not handed to dsopt (the buckets
    keep parameter order). ``buckets`` (a list): gets, before and after the
    first step, l1.weight's bucket and the number of buckets."""
    model = net(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # torch < 2.1: no grad hooks
        opt = dsopt.torch.Optimizer(model.parameters(), config, comm, overlap=overlap)
    if not record:
        opt._forward_order = None
    seen, deferred = [], False
    for step in range(steps):
        opt.zero_grad()
        if buckets is not None and step == 0:  # before the hooks of backward hand it over
            first = [p is model.l1.weight for p in model.parameters()].index(True)
            buckets.append((opt.dsopt.gather_bucket_of(first), opt.dsopt.gather_buckets))
        x, y = batch(step, rank, dtype)
        loss = ((model(x).float() - y.float()) ** 2).mean()
        loss.backward()
        opt.step()
        if buckets is not None and step == 0:
            buckets.append((opt.dsopt.gather_bucket_of(first), opt.dsopt.gather_buckets))
        deferred = deferred or opt._gathering
        seen.append(("loss", float(loss.detach())))
        if step % 3 == 0:
            with torch.no_grad():
                seen.append(("eval", model(batch(100 + step, rank, dtype)[0]).clone()))
        elif step % 3 == 1:
            seen.append(("model", {k: v.clone() for k, v in model.state_dict().items()}))
        else:
            seen.append(("blob", opt.state_dict()["dsopt_state"]))
    params = [p.detach().clone() for p in model.parameters()]
    in_config = opt.dsopt.config["zero_optimization"]["deferred_allgather"]
    opt.close()
    return params, seen, deferred, in_config


def same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def check_all(comm=None, rank=0, size=1):
    checked = 0
    for name, config in CONFIGS.items():
        for dtype in (torch.float32, torch.bfloat16):
            got, got_seen, deferred, in_config = run(config, True, dtype, comm, rank)
            want, want_seen, _, off = run(config, False, dtype, comm, rank)
            what = f"{name}, {dtype}, P={size}"
            assert in_config and not off, what
            assert same(got, want), f"{what}: parameters differ"
            for (kind, x), (_, y) in zip(got_seen, want_seen):
                assert same(x, y), f"{what}: {kind} differs"
            if size > 1:
                assert deferred, f"{what}: the gathers were never deferred"
            checked += 1
    return checked


def check_forward_order(comm=None, rank=0, size=1):
    """The reversed net: overlap=True hands its forward order to dsopt at
    the first step, and l1's bucket then arrives first; parameters,
    losses, evaluations, model.state_dict() and blobs are those of
    overlap=False and of overlap=True in parameter order, bit for bit."""
    checked = 0
    for name, config in ORDER_CONFIGS.items():
        for dtype in (torch.float32, torch.bfloat16):
            what = f"{name}, {dtype}, P={size}"
            buckets = []
            ordered = run(config, True, dtype, comm, rank, net=ReversedNet, buckets=buckets)
            layout = run(config, True, dtype, comm, rank, net=ReversedNet, record=False)
            plain = run(config, False, dtype, comm, rank, net=ReversedNet)
            for other in (layout, plain):
                assert same(ordered[0], other[0]), f"{what}: parameters differ"
                for (kind, x), (_, y) in zip(ordered[1], other[1]):
                    assert same(x, y), f"{what}: {kind} differs"
            (before, count), (after, _) = buckets
            if size == 1:
                assert before == after == -1 and count == 0, (what, buckets)
            else:
                assert ordered[2] and layout[2], f"{what}: the gathers were never deferred"
                assert after <= before, (what, buckets)
                if name == "zero2 one reduce bucket":
                    assert (before, after, count) == (count - 1, 0, 3), (what, buckets)
            checked += 1
    return checked


def phase_prefetch(comm, rank, size):
    return check_all(comm, rank, size)


def phase_order(comm, rank, size):
    return check_forward_order(comm, rank, size)


if __name__ == "__main__":
    from mpi_phases import main

    sys.exit(main({"prefetch": phase_prefetch, "order": phase_order}))
