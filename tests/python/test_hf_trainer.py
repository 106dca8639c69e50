"""dsopt.hf.Trainer (transformers' Trainer with a dsopt.torch optimizer) at
1 and 2 gloo ranks (hf_trainer_worker.py): it trains as dsopt alone does
(the same losses and parameters, bit for bit: the same float operations on
the same batches, dsopt's sums in a fixed order), with one reduction
(dsopt's bytes per step, DDP's own allreduce replaced by
dsopt.torch.ddp_comm_hook), max_grad_norm as dsopt's clipping, and
checkpoints that hold every rank's optimizer state: a resumed run is the
uninterrupted one bit for bit (AdamW, ZeRO-2, 1-bit Adam compressing,
LAMB under ZeRO-2), and
ZeRO-2 resumes at another world size. With torch.optim it is
transformers.Trainer.

Needs transformers (PyPI's torch and transformers: `make test-frameworks`)
and scikit-learn. With DSOPT_HF_DEVICE=cuda (`make test-gpu`) the Trainer
trains on the GPU, both ranks on one."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="dsopt.hf needs transformers (pip install "
                    "transformers accelerate; `make test-frameworks` makes a venv with them)")
pytest.importorskip("sklearn", reason="the test data are scikit-learn's digits")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import conftest  # noqa: E402
import dsopt  # noqa: E402
import dsopt.torch  # noqa: E402
import hf_trainer_worker as worker  # noqa: E402

import dsopt.hf  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

if worker.DEVICE.type != "cpu" and not torch.cuda.is_available():
    pytest.skip(f"DSOPT_HF_DEVICE={worker.DEVICE}, but torch sees no GPU",
                allow_module_level=True)

SCENARIOS = list(worker.SCENARIOS)
NUMEL = sum(p.numel() for p in worker.DigitsNet(0).parameters())


def launch(world, out_dir, phases, *extra, timeout=300):
    """hf_trainer_worker.py on ``world`` processes (RANK, WORLD_SIZE, ...
    as torchrun sets them); {phase: [each rank's result]}."""
    procs = conftest.start_ranks("hf_trainer_worker.py", [out_dir, ",".join(phases), *extra], world,
                                 one_device=worker.DEVICE.type != "cpu")
    conftest.wait_for(procs, f"hf_trainer_worker.py on {world} ranks", timeout)
    return {phase: [torch.load(out_dir / f"{phase}-rank{rank}.pt", weights_only=False)
                    for rank in range(world)] for phase in phases}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("hf_trainer_2")
    runs = launch(2, out_dir, ["main", "torch"])
    runs["zero2_checkpoint"] = out_dir / "zero2" / f"checkpoint-{worker.SAVE_AT}"
    return runs


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, two_ranks):
    out_dir = tmp_path_factory.mktemp("hf_trainer_1")
    return launch(1, out_dir, ["main", "torch", "reshard"], str(two_ranks["zero2_checkpoint"]))


@pytest.fixture(params=[1, 2], ids=["1rank", "2ranks"])
def runs(request):
    return request.getfixturevalue({1: "one_rank", 2: "two_ranks"}[request.param])


def micro_batches(name):
    """Forward passes per optimizer step in scenario ``name``."""
    return worker.SCENARIOS[name][3].get("gradient_accumulation_steps", 1)


def equal_lists(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", SCENARIOS)
def test_trainer_trains_as_dsopt_alone(runs, name):
    for rank, result in enumerate(runs["main"]):
        full, alone = result[name]["full"], result[name]["alone"]
        assert len(full["losses"]) == worker.STEPS * micro_batches(name)
        assert equal_lists(full["losses"], alone["losses"]), (rank, full["losses"], alone["losses"])
        assert torch.equal(full["params"], alone["params"]), \
            (rank, (full["params"] - alone["params"]).abs().max())
    first = runs["main"][0][name]["full"]
    assert first["losses"][-1] < first["losses"][0] or name == "onebit"
    assert not torch.equal(first["params"], worker.flat_params(worker.DigitsNet(worker.SEED)))


@pytest.mark.parametrize("name", SCENARIOS)
def test_gradients_reach_dsopt_unreduced(runs, name):
    """.grad before each step is this rank's own gradient (what the plain
    loop computes): DDP averaged nothing."""
    grads = []
    for rank, result in enumerate(runs["main"]):
        full, alone = result[name]["full"], result[name]["alone"]
        assert equal_lists(full["grads"], alone["grads"]), rank
        grads.append(full["grads"])
    if len(grads) == 2:
        assert not any(torch.equal(a, b) for a, b in zip(*grads)), "the ranks had the same data"


def test_created_optimizer_runs_on_the_default_group(runs):
    for result in runs["main"]:
        assert result["adamw"]["full"]["comm_size"] == result["world"]
        assert result["onebit"]["full"]["comm_size"] == result["world"]


def test_optimizer_of_one_process_at_several_ranks_is_an_error(runs):
    for result in runs["main"]:
        message = result["single_process_optimizer_error"]
        if result["world"] == 1:
            assert message == ""
        else:
            assert "runs on 1 rank(s), the Trainer on 2 process(es)" in message


@pytest.mark.parametrize("name", SCENARIOS)
def test_resume_is_bit_identical(runs, name):
    for rank, result in enumerate(runs["main"]):
        full, resumed = result[name]["full"], result[name]["resumed"]
        done = worker.SAVE_AT * micro_batches(name)
        assert equal_lists(resumed["losses"], full["losses"][done:]), \
            (rank, resumed["losses"], full["losses"])
        assert torch.equal(resumed["params"], full["params"]), \
            (rank, (resumed["params"] - full["params"]).abs().max())


def test_onebit_checkpoint_is_in_the_compressed_stage(runs):
    infos = runs["main"][0]["onebit"]["full"]["infos"]
    if runs["main"][0]["world"] > 1:
        assert all(i["compressed"] for i in infos[1:worker.SAVE_AT])


@pytest.mark.parametrize("name", SCENARIOS)
def test_one_reduction_dsopts(two_ranks, name):
    """dsopt sends what it sends alone; DDP's hook is dsopt's and the
    process writes to its sockets what the plain loop writes (DDP's own
    allreduce would add about a gradient's bytes per step)."""
    for rank, result in enumerate(two_ranks["main"]):
        full, alone = result[name]["full"], result[name]["alone"]
        sent = [i["bytes_sent"] for i in full["infos"]]
        assert sent == [i["bytes_sent"] for i in alone["infos"]], rank
        assert all(s > 0 for s in sent)
        assert full["hooks"] == {"hooks": ["dsopt.torch._ddp.ddp_comm_hook"],
                                 "logged": "ddp_comm_hook"}, rank
        for step, (wrote, alone_wrote) in enumerate(zip(full["wrote"], alone["wrote"])):
            assert alone_wrote >= sent[step], (rank, step)  # wchar sees the sockets
            assert wrote < alone_wrote + 4 * NUMEL // 4, (rank, step, wrote, alone_wrote)


def test_onebit_compresses_under_the_trainer(two_ranks):
    for result in two_ranks["main"]:
        adamw = result["adamw"]["full"]["infos"]
        onebit = result["onebit"]["full"]["infos"]
        assert all(o["bytes_sent"] * 4 < a["bytes_sent"] for o, a in zip(onebit[1:], adamw[1:]))


def test_no_double_reduction_warning(two_ranks):
    assert issubclass(dsopt.DoubleReductionWarning, UserWarning)  # what dsopt would warn
    for phase in ("main", "torch"):
        for rank, result in enumerate(two_ranks[phase]):
            double = [w for w in result["warnings"] if w.startswith("DoubleReductionWarning")]
            assert not double, (phase, rank, double)


@pytest.mark.parametrize("name", ["adamw", "zero2"])
def test_max_grad_norm_is_dsopts_clipping(runs, name):
    """The logged grad_norm is dsopt's (the averaged gradient's norm, the
    same as dsopt alone's), above max_grad_norm: the clipping acted (and
    the training equals dsopt alone's with gradient_clipping, see
    test_trainer_trains_as_dsopt_alone)."""
    for result in runs["main"]:
        full, alone = result[name]["full"], result[name]["alone"]
        norms = [i["grad_norm"] for i in alone["infos"]]
        assert full["logged_grad_norms"] == norms
        assert min(norms) > worker.CLIP


def test_zero2_resumes_at_another_world_size(one_rank, two_ranks):
    result = one_rank["reshard"][0]
    assert result["saved_ranks"] == 2
    # The one rank's moments at the start are the two ranks' shards at the save.
    shards = [r["zero2"]["full"]["saved_state"] for r in two_ranks["main"]]
    for i, whole in enumerate(result["resumed"]["start_state"]):
        for key in ("exp_avg", "exp_avg_sq"):
            parts = sorted((s[i]["offset"], s[i][key]) for s in shards if s[i][key].numel())
            assert torch.equal(torch.cat([t for _, t in parts]), whole[key]), (i, key)
    resumed, alone = result["resumed"], result["alone"]
    assert len(resumed["losses"]) == worker.STEPS - worker.SAVE_AT
    assert equal_lists(resumed["losses"], alone["losses"])
    assert torch.equal(resumed["params"], alone["params"])


def test_torch_optim_is_transformers_trainer(runs):
    for rank, result in enumerate(runs["torch"]):
        ours, theirs = result["dsopt_hf"], result["transformers"]
        assert ours["optimizer"] == theirs["optimizer"] == "AdamW"
        assert ours["log"] == theirs["log"] and len(ours["log"]) > worker.STEPS, rank
        assert equal_lists(ours["losses"], theirs["losses"]), rank
        assert torch.equal(ours["params"], theirs["params"]), rank
        assert ours["hooks"] == theirs["hooks"], rank  # DDP's own reduction, no hook


# ---- one process, no torch.distributed ---------------------------------------

def test_one_process_trains_as_dsopt_alone(tmp_path):
    result = worker.scenario("adamw", str(tmp_path))
    full, alone, resumed = result["full"], result["alone"], result["resumed"]
    assert full["hooks"] is None and full["comm_size"] == 1
    assert equal_lists(full["losses"], alone["losses"])
    assert torch.equal(full["params"], alone["params"])
    assert torch.equal(resumed["params"], full["params"])


def trainer(tmp_path, **kwargs):
    args = worker.training_args(str(tmp_path), max_grad_norm=kwargs.pop("max_grad_norm", 1.0))
    return dsopt.hf.Trainer(model=kwargs.pop("model", None) or worker.DigitsNet(0), args=args,
                            train_dataset=worker.Digits(), **kwargs)


def test_passed_optimizer_clipping_other_than_max_grad_norm_is_an_error(tmp_path):
    model = worker.DigitsNet(0)
    opt = dsopt.torch.AdamW(model.parameters(), gradient_clipping=0.5)
    with pytest.raises(ValueError, match=r"max_grad_norm=1 .*gradient_clipping=1"):
        trainer(tmp_path, model=model, optimizers=(opt, None))
    assert opt.gradient_clipping == 0.5  # refused: nothing changed
    # max_grad_norm=0 leaves the optimizer's own clipping; equal values agree
    assert trainer(tmp_path, model=model, optimizers=(opt, None), max_grad_norm=0)
    assert opt.gradient_clipping == 0.5
    opt.close()
    opt = dsopt.torch.AdamW(model.parameters(), gradient_clipping=1.0)
    assert trainer(tmp_path, model=model, optimizers=(opt, None)).dsopt_optimizer is opt
    opt.close()


def test_passed_optimizer_without_clipping_gets_max_grad_norm(tmp_path):
    """As transformers.Trainer clips a torch.optim optimizer's gradients at
    max_grad_norm, the Trainer hands max_grad_norm to a dsopt optimizer
    that does not clip (dsopt then clips the averaged gradient)."""
    model = worker.DigitsNet(0)
    opt = dsopt.torch.AdamW(model.parameters())
    assert opt.gradient_clipping == 0.0
    assert trainer(tmp_path, model=model, optimizers=(opt, None), max_grad_norm=0.75)
    assert opt.gradient_clipping == 0.75
    opt.close()


def test_created_optimizer_clipping_other_than_max_grad_norm_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="max_grad_norm=1 .*clips at 0.5"):
        trainer(tmp_path, optimizer_cls_and_kwargs=(dsopt.torch.AdamW,
                                                    {"gradient_clipping": 0.5}))
    with pytest.raises(ValueError, match="max_grad_norm=1 .*clips at 0.5"):
        trainer(tmp_path, optimizer_cls_and_kwargs=(
            dsopt.torch.Optimizer, {"config": {"optimizer": {"type": "AdamW"},
                                               "gradient_clipping": 0.5}}))


def test_created_config_optimizer_gets_max_grad_norm(tmp_path):
    t = trainer(tmp_path, optimizer_cls_and_kwargs=(
        dsopt.torch.Optimizer, {"config": {"optimizer": {"type": "AdamW"}}}))
    t.create_optimizer()
    assert t.dsopt_optimizer._config["gradient_clipping"] == 1.0
    t.dsopt_optimizer.close()


def test_overlap_optimizer_is_an_error(tmp_path):
    model = worker.DigitsNet(0)
    opt = dsopt.torch.AdamW(model.parameters(), overlap=True, gradient_clipping=1.0)
    with pytest.raises(ValueError, match="overlap=True"):
        trainer(tmp_path, model=model, optimizers=(opt, None))
    opt.close()


def test_importing_dsopt_imports_neither_transformers_nor_torch():
    code = ("import sys, dsopt; assert 'torch' not in sys.modules, 'torch'; import dsopt.torch; "
            "assert 'transformers' not in sys.modules, 'transformers'")
    proc = subprocess.run([sys.executable, "-c", code], env=conftest.subprocess_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_documented_script_is_the_example():
    page = (conftest.REPO_ROOT / "docs" / "frameworks" / "hf-trainer.md").read_text()
    example = (conftest.REPO_ROOT / "examples" / "python" / "hf_trainer.py").read_text()
    assert "```python\n" + example + "```" in page
