"""dsopt.lightning.DsoptStrategy under PyTorch Lightning, CPU and gloo, at 2
ranks (Lightning's own launcher, and processes started with torchrun's
variables) and at 1 (lightning_worker.py runs them):

* Lightning's training is the one dsopt alone does, bit for bit (the same
  floating-point operations in the same order: forward, backward and
  dsopt's step, whose reduction on host memory sums in a fixed order),
  from rank 0's parameters on every rank, with an LR scheduler and with
  gradient accumulation;
* dsopt sends what it sends alone, nothing else sends gradients (the model
  is not wrapped in DDP; the process writes about what dsopt alone writes)
  and dsopt sees no double reduction;
* resuming from a checkpoint at the same world size continues bit for bit
  for AdamW, ZeRO-2, 1-bit Adam (in its compressed stage) and LAMB under ZeRO-2, the
  checkpoint holding every rank's dsopt state; ZeRO-2 saved at 2 ranks
  continues at 1 rank (the same samples per step, within fp32 rounding);
* Trainer(gradient_clip_val=...) is dsopt's clipping of the averaged
  gradients: the training of dsopt alone with gradient_clipping set;
* torch.optim optimizers, a gradient_clip_val other than the optimizer's
  own clipping, clipping by value, a communicator other than the default
  group, GradScaler and overlap with accumulation are refused with messages
  that say what to do instead.

Needs lightning, PyPI torch and scikit-learn (`make test-frameworks`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)
if subprocess.run([sys.executable, "-c", "import lightning"], capture_output=True).returncode:
    pytest.skip(f"lightning is not installed for {sys.executable} (pip install lightning; "
                f"`make test-frameworks` uses a venv that has it)", allow_module_level=True)

import conftest  # noqa: E402

WORLD = 2
DEVICE = os.environ.get("DSOPT_LIGHTNING_DEVICE")
NAMES = ("adamw", "adamw_zero2", "onebit_adam", "lamb_zero2", "compressed_zero2")
EPOCH_STEPS = 4
TIMEOUT = 300


def run(procs, what):
    conftest.wait_for(procs, f"lightning_worker.py {what}", TIMEOUT)


def worker(launch, out_dir, **env):
    return subprocess.Popen(
        [sys.executable, str(conftest.HERE / "lightning_worker.py"), launch, str(out_dir)],
        env=conftest.subprocess_env(OMP_NUM_THREADS="1", **env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


def read(out_dir, launch, ranks):
    return [json.loads((out_dir / f"{launch}-rank{rank}.json").read_text()) for rank in ranks]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    """Lightning's launcher at 2 ranks, then rank 0 at world size 1."""
    out_dir = tmp_path_factory.mktemp("lightning_launcher")
    run([worker("launcher", out_dir, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(conftest.free_port()))],
        "launcher")
    return read(out_dir, "launcher", range(WORLD)), read(out_dir, "one_rank", [0])[0]


@pytest.fixture(scope="module")
def environment(tmp_path_factory):
    """One process per rank with the variables torchrun sets."""
    out_dir = tmp_path_factory.mktemp("lightning_environment")
    run(conftest.start_ranks("lightning_worker.py", ["environment", out_dir], WORLD,
                             GROUP_RANK="0", LOCAL_WORLD_SIZE=str(WORLD)), "environment")
    return read(out_dir, "environment", range(WORLD))


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    """Two processes on one device (DSOPT_LIGHTNING_DEVICE: `make test-gpu`
    sets cuda), each a node of one."""
    if DEVICE is None:
        pytest.skip("the GPU variant (`make test-gpu` sets DSOPT_LIGHTNING_DEVICE=cuda; "
                    "DSOPT_LIGHTNING_DEVICE=cpu runs it on the CPU, which the launcher "
                    "tests above cover)")
    if DEVICE != "cpu" and not torch.cuda.is_available():
        pytest.skip(f"DSOPT_LIGHTNING_DEVICE={DEVICE}, but torch sees no GPU")
    out_dir = tmp_path_factory.mktemp("lightning_device")
    ranks = [subprocess.Popen(
        [sys.executable, str(conftest.HERE / "lightning_worker.py"), "device", str(out_dir)],
        env=dict(env, RANK=str(rank), GROUP_RANK=str(rank)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for env in [conftest.subprocess_env(
            OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(conftest.free_port()),
            WORLD_SIZE=str(WORLD), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")] for rank in range(WORLD)]
    run(ranks, "device")
    return read(out_dir, "device", range(WORLD))


@pytest.mark.parametrize("name", ["adamw", "adamw_zero2", "onebit_adam"])
def test_two_processes_on_one_device_train_and_resume_as_dsopt_alone(device, name):
    for rank in range(WORLD):
        full, resumed, alone = (device[rank][name][k] for k in ("full", "resumed", "alone"))
        assert full["device"].startswith(DEVICE), full["device"]
        assert (full["world"], full["rank"]) == (WORLD, rank)
        assert full["model"] == "Classifier"
        assert full["losses"] == alone["losses"], f"rank {rank}"
        assert full["params"] == alone["params"], f"rank {rank}"
        assert full["bytes_sent"] == alone["bytes_sent"], f"rank {rank}"
        assert resumed["losses"] == full["losses"][EPOCH_STEPS:], f"rank {rank}"
        assert resumed["params"] == full["params"], f"rank {rank}"
    assert device[0][name]["full"]["params"] == device[1][name]["full"]["params"]


def double_reductions(run_result):
    return [w for w in run_result["warnings"] if w.startswith("DoubleReductionWarning")]


@pytest.mark.parametrize("name", NAMES)
def test_trains_as_dsopt_alone(launcher, name):
    runs, _ = launcher
    for rank in range(WORLD):
        full, alone = runs[rank][name]["full"], runs[rank][name]["alone"]
        assert (full["world"], full["rank"]) == (WORLD, rank)
        assert full["losses"] == alone["losses"], f"rank {rank}"
        assert full["params"] == alone["params"], f"rank {rank}"
    assert runs[0][name]["full"]["params"] == runs[1][name]["full"]["params"]
    assert runs[0][name]["full"]["losses"] != runs[1][name]["full"]["losses"]  # own samples
    losses = runs[0][name]["alone"]["losses"]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("name", NAMES)
def test_sends_what_dsopt_alone_sends(launcher, name):
    runs, _ = launcher
    for rank in range(WORLD):
        full, alone = runs[rank][name]["full"], runs[rank][name]["alone"]
        assert full["model"] == "Classifier"  # no DistributedDataParallel around it
        assert full["bytes_sent"] == alone["bytes_sent"], f"rank {rank}"
        # What the process wrote during the training batches: dsopt's
        # traffic, about as alone; one fp32 allreduce of the gradients
        # would add their bytes at every step.
        grad_bytes = 4 * alone["numel"] * len(alone["losses"])
        assert full["wrote"] < alone["wrote"] + grad_bytes // 4, (rank, full["wrote"],
                                                                  alone["wrote"])
        assert alone["wrote"] >= sum(alone["bytes_sent"]) // 2
        assert double_reductions(full) == [] and double_reductions(alone) == []
    if name == "onebit_adam":  # compressed: far less than the gradients
        sent = runs[0][name]["alone"]["bytes_sent"]
        assert sent[-1] < sent[0] / 4


@pytest.mark.parametrize("name", NAMES)
def test_resumes_bit_identically(launcher, name):
    runs, _ = launcher
    for rank in range(WORLD):
        full, resumed = runs[rank][name]["full"], runs[rank][name]["resumed"]
        assert len(resumed["losses"]) == len(full["losses"]) - EPOCH_STEPS
        assert resumed["losses"] == full["losses"][EPOCH_STEPS:], f"rank {rank}"
        assert resumed["params"] == full["params"], f"rank {rank}"
        # (1-bit Adam: resumed in its compressed stage)
        assert resumed["bytes_sent"][-1] == full["bytes_sent"][-1], f"rank {rank}"
    # rank 0 saved the one file, with both ranks' dsopt state (each rank
    # resumed its own ZeRO shard and 1-bit compression errors above)
    assert runs[0][name]["checkpoint"] == WORLD


def test_zero2_saved_at_two_ranks_continues_at_one(launcher):
    runs, one_rank = launcher
    resumed = one_rank["zero2_at_1"]
    assert resumed["world"] == 1
    # Each step's 32 samples at 1 rank are the 2 x 16 of the 2-rank run:
    # the same mean gradient, summed in another order.
    full = [runs[rank]["adamw_zero2"]["full"] for rank in range(WORLD)]
    expected = np.mean([f["losses"][EPOCH_STEPS:] for f in full], axis=0)
    np.testing.assert_allclose(resumed["losses"], expected, rtol=2e-6)
    for got, want in zip(resumed["params"], full[0]["params"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_one_rank(launcher):
    _, one_rank = launcher
    full, resumed, alone = (one_rank["adamw"][k] for k in ("full", "resumed", "alone"))
    assert full["world"] == 1
    assert full["losses"] == alone["losses"] and full["params"] == alone["params"]
    assert resumed["losses"] == full["losses"][EPOCH_STEPS:]
    assert resumed["params"] == full["params"]
    assert full["bytes_sent"] == alone["bytes_sent"]


def test_gradient_accumulation(environment):
    for rank in range(WORLD):
        lightning_run = environment[rank]["accumulated"]["lightning"]
        alone = environment[rank]["accumulated"]["alone"]
        assert len(lightning_run["bytes_sent"]) == EPOCH_STEPS  # 8 batches, 4 steps
        assert lightning_run["losses"] == alone["losses"], f"rank {rank}"
        assert lightning_run["params"] == alone["params"], f"rank {rank}"
        assert lightning_run["bytes_sent"] == alone["bytes_sent"]


def test_gradient_clip_val_is_dsopts_clipping(environment):
    for rank in range(WORLD):
        run = environment[rank]["clipped"]
        assert run["lightning"]["losses"] == run["alone"]["losses"], f"rank {rank}"
        assert run["lightning"]["params"] == run["alone"]["params"], f"rank {rank}"
        assert run["alone"]["params"] != run["unclipped"]["params"]  # the clipping acted


@pytest.mark.parametrize("case, says", [
    ("torch_optimizer", ["AdamW", "not a dsopt.torch optimizer", "strategy='ddp'"]),
    ("gradient_clip_mismatch", ["gradient_clip_val=0.5", "gradient_clipping=0.25"]),
    ("gradient_clip_value", ["gradient_clip_algorithm='value'", "norm"]),
    ("local_comm", ["rank 0 of 1", "of 2", "without comm="]),
    ("fp16_scaler", ["'16-mixed'", "GradScaler", "bf16-mixed"]),
    ("overlap_accumulate", ["overlap=True", "accumulate_grad_batches=2"]),
])
def test_refused_settings(environment, case, says):
    for rank in range(WORLD):
        message = environment[rank]["refused"][case]
        assert message is not None, f"{case} was not refused on rank {rank}"
        assert message.startswith("MisconfigurationException: DsoptStrategy: "), message
        for words in says:
            assert words in message, message


def test_doc_shows_the_example():
    doc = (conftest.REPO_ROOT / "docs" / "frameworks" / "lightning.md").read_text()
    script = (conftest.REPO_ROOT / "examples" / "python" / "lightning_train.py").read_text()
    assert f"```python\n{script}```\n" in doc, "lightning.md's script is not lightning_train.py"
