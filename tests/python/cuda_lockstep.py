"""What the CUDA tests share (test_cuda_torch.py, test_cuda_torch_dist.py,
cuda_dist_worker.py): every dsopt.torch configuration a user trains with,
and a lockstep run of it: one model on the CPU and the same model on the
device under test, each with its own dsopt.torch optimizer, stepped with
the same gradients (computed on the CPU model from this rank's batch),
compared bit for bit after every step.

The device under test is ``cuda`` (torch's current device) where torch
sees a GPU. ``DSOPT_TEST_DEVICE=cpu`` runs the same tests with the CPU as
the device under test: a dry run of their code on a machine without a GPU
(both sides are then the CPU, so it checks the tests, not CUDA).
``DSOPT_REQUIRE_CUDA=1`` (``make test-gpu``) turns the skips for a missing
GPU or a library built without CUDA into failures."""

import copy
import os
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
for path in (HERE.parent.parent / "bindings" / "python", HERE.parent.parent / "examples" / "python",
             HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402

STEPS = 12
FREEZE = 4  # the 1-bit optimizers compress from step FREEZE + 1 on
BUCKET = 700  # ZeRO buckets smaller than the model (874 elements): several per step


def _config(kind, params=None, **top):
    config = {"optimizer": {"type": kind, "params": dict({"lr": 0.01}, **(params or {}))},
              "threads": 1}
    config.update(top)
    return config


def _zero(stage, **compression):
    zero = {"stage": stage, "reduce_bucket_size": BUCKET, "allgather_bucket_size": BUCKET}
    if compression:
        zero["compression"] = compression
    return zero


CONFIGS = {
    "AdamW": _config("AdamW", {"weight_decay": 0.01}),
    "Adam_clipped": _config("Adam", {"adam_w_mode": False, "weight_decay": 0.01},
                            gradient_clipping=0.5),
    "Lamb": _config("Lamb", {"weight_decay": 0.01}),
    "OneBitAdam": _config("OneBitAdam", {"freeze_step": FREEZE}),
    "OneBitLamb": _config("OneBitLamb", {"freeze_step": FREEZE}),
    "ZeroOneAdam": _config("ZeroOneAdam", {"var_freeze_step": FREEZE, "local_step_clipper": 2}),
    "AdamW_zero2": _config("AdamW", {"weight_decay": 0.01}, zero_optimization=_zero(2)),
    "Lamb_zero2": _config("Lamb", {}, zero_optimization=_zero(2)),
    "AdamW_zero2_int4_int8": _config("AdamW", {}, zero_optimization=_zero(
        2, gradients="int4", parameters="int8")),
    "AdamW_zero1_sign_bf16": _config("AdamW", {}, zero_optimization=_zero(
        1, gradients="sign", parameters="bf16")),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The configs under ZeRO stage 1/2, which overlap=True runs with the
# parameter allgather deferred.
ZERO_CONFIGS = [name for name, c in CONFIGS.items() if c.get("zero_optimization", {}).get("stage")]


def _device_under_test():
    wanted = os.environ.get("DSOPT_TEST_DEVICE", "cuda")
    if wanted == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", torch.cuda.current_device())


DEVICE = _device_under_test()
REQUIRED = os.environ.get("DSOPT_REQUIRE_CUDA") == "1"


def missing():
    """Why the CUDA tests cannot run here ("" when they can)."""
    if DEVICE is None:
        return ("torch sees no CUDA device (torch.cuda.is_available() is False); `make "
                "test-gpu` runs these tests on a machine with a GPU")
    if DEVICE.type == "cuda":
        from dsopt_testing import build_feature

        if build_feature("cuda") == "off":
            return "libdsopt was built without CUDA (`make test-gpu` builds it with CUDA)"
    return ""


def config(name, device, dtype):
    """The config of ``name`` for parameters of ``dtype`` on ``device``."""
    result = copy.deepcopy(CONFIGS[name])
    if torch.device(device).type == "cuda":
        result["device"] = "cuda"
    if dtype == torch.bfloat16:
        result["bf16"] = {"enabled": True}
    return result


def digits():
    """(x, y): the training part of scikit-learn's digits."""
    from small_models import load_digits_split

    data = load_digits_split()
    return torch.from_numpy(data.x_train), torch.from_numpy(data.y_train)


def make_model(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 12), torch.nn.Tanh(), torch.nn.Linear(12, 10))
    return model.to(device=device, dtype=dtype)


def batches(world=1, rank=0, batch=32, steps=STEPS, seed=1):
    """This rank's part of each global batch of ``batch`` rows."""
    x, y = digits()
    draw = np.random.RandomState(seed)
    local = batch // world
    for _ in range(steps):
        rows = torch.from_numpy(draw.choice(len(y), batch, replace=False)[rank * local:
                                                                          (rank + 1) * local])
        yield x[rows], y[rows]


def bits(tensor):
    """The tensor's bits on the CPU, as integers (compared with torch.equal)."""
    tensor = tensor.detach().cpu().contiguous()
    return tensor.view({4: torch.int32, 2: torch.int16}[tensor.element_size()])


def first_difference(a_params, b_params):
    """'tensor i[j]: x vs y (n differ)' for the first element where two
    lists of tensors differ bit for bit, else None."""
    for i, (a, b) in enumerate(zip(a_params, b_params)):
        a_bits, b_bits = bits(a).reshape(-1), bits(b).reshape(-1)
        differ = torch.nonzero(a_bits != b_bits).reshape(-1)
        if len(differ):
            j = int(differ[0])
            return (f"tensor {i}[{j}]: {a.detach().reshape(-1)[j].item()!r} vs "
                    f"{b.detach().reshape(-1)[j].item()!r} ({len(differ)} elements differ)")
    return None


def loss_of(model, x, y):
    dtype = next(model.parameters()).dtype
    return torch.nn.functional.cross_entropy(model(x.to(dtype)).float(), y)


class Lockstep:
    """The CPU model and the model on ``device`` with their dsopt.torch
    optimizers (``comms``: the CPU's and the device's communicator, None:
    the default), stepped with the CPU model's gradients."""

    def __init__(self, name, device, dtype=torch.float32, comms=(None, None), overlap=False):
        self.name, self.device = name, torch.device(device)
        self.cpu = make_model(dtype)
        self.dut = make_model(dtype, device)
        self.cpu_opt = dsopt.torch.Optimizer(self.cpu.parameters(), config(name, "cpu", dtype),
                                             comm=comms[0])
        self.dut_opt = dsopt.torch.Optimizer(self.dut.parameters(), config(name, device, dtype),
                                             comm=comms[1], overlap=overlap)
        self.grads = []  # the gradients of every step, as the CPU computed them

    def gradients(self, x, y):
        """The CPU model's gradients on (x, y), and its loss."""
        self.cpu_opt.zero_grad()
        loss = loss_of(self.cpu, x, y)
        loss.backward()
        return [p.grad.clone() for p in self.cpu.parameters()], float(loss)

    def step(self, x, y):
        grads, loss = self.gradients(x, y)
        self.grads.append(grads)
        self.dut_opt.zero_grad()
        for q, g in zip(self.dut.parameters(), grads):
            q.grad = g.to(q.device, copy=True)
        self.cpu_opt.step()
        self.dut_opt.step()
        return loss

    def difference(self):
        return first_difference(list(self.cpu.parameters()), list(self.dut.parameters()))

    def infos(self):
        return self.cpu_opt.last_step_info, self.dut_opt.last_step_info

    def close(self):
        self.cpu_opt.close()
        self.dut_opt.close()


def run_lockstep(name, device, dtype, world=1, rank=0, comms=(None, None), steps=STEPS,
                 overlap=False):
    """{"mismatch", "losses", "compressed", "bytes_sent", "params"} of a
    lockstep run: ``mismatch`` is the first step where the two sides
    differed (parameters, or what the step did), None when they never did.
    Every step is taken either way, so that ranks stay together. With
    ``overlap`` the device's optimizer has overlap=True (under ZeRO: the
    parameter allgather deferred behind the next forward), and a forward of
    the device's model (whose module hooks wait for the gathers) comes
    before each comparison."""
    run = Lockstep(name, device, dtype, comms, overlap=overlap)
    out = {"mismatch": None, "losses": [], "compressed": [], "bytes_sent": []}
    try:
        for step, (x, y) in enumerate(batches(world, rank, steps=steps), 1):
            out["losses"].append(run.step(x, y))
            if overlap:
                with torch.no_grad():
                    run.dut(x.to(run.device, next(run.dut.parameters()).dtype))
            a, b = run.infos()
            difference = run.difference()
            if difference is not None:
                difference = f"parameters at {difference}"
            # (overlap=True hands the gradients over, whose handshake adds
            # 16 bytes to bytes_sent)
            fields = ["step", "skipped", "compressed", "phase", "grad_norm", "loss_scale"]
            for field in fields if overlap else fields + ["bytes_sent"]:
                if difference is None and getattr(a, field) != getattr(b, field):
                    difference = f"info.{field} {getattr(a, field)} on the CPU, " \
                                 f"{getattr(b, field)} on {device}"
            if difference is not None and out["mismatch"] is None:
                out["mismatch"] = f"{name} {dtype}: CPU and {device} differ after step {step}: " \
                                  f"{difference}"
            out["compressed"].append(bool(b.compressed))
            out["bytes_sent"].append(int(b.bytes_sent))
        out["params"] = torch.cat([bits(p).reshape(-1).to(torch.int32)
                                   for p in run.dut.parameters()]).numpy()
    finally:
        run.close()
    return out
