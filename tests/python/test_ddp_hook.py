"""DistributedDataParallel with dsopt.torch optimizers at 2 gloo ranks
(ddp_hook_worker.py): with ``dsopt.torch.ddp_comm_hook`` the training is
the one dsopt alone does (same losses and parameters, bit for bit), dsopt
sends what it sends alone and DDP sends nothing more; without the hook DDP
averages every gradient first, dsopt averages the equal gradients again
(twice the bytes) and says so once (``dsopt.DoubleReductionWarning``).

Needs torch (PyPI's: `make test-frameworks`) and scikit-learn. With
DSOPT_DDP_DEVICE=cuda (`make test-gpu`) the model is on the GPU, both
ranks on one."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)
if not hasattr(torch.nn.parallel.DistributedDataParallel, "register_comm_hook"):
    pytest.skip("DDP communication hooks need torch >= 1.8", allow_module_level=True)

import conftest  # noqa: E402

WORLD = 2
DEVICE = os.environ.get("DSOPT_DDP_DEVICE", "cpu")
if DEVICE != "cpu" and not torch.cuda.is_available():
    pytest.skip(f"DSOPT_DDP_DEVICE={DEVICE}, but torch sees no GPU", allow_module_level=True)
NAMES = ("adamw", "adamw_zero2", "onebit_adam", "onebit_lamb", "zero_one_adam")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("ddp_hook")
    conftest.wait_for(conftest.start_ranks("ddp_hook_worker.py", [out_dir], WORLD),
                      "ddp_hook_worker.py", timeout=240)
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.parametrize("name", NAMES)
def test_hook_trains_as_dsopt_alone(runs, name):
    for rank in range(WORLD):
        for mode in ("alone", "hook", "ddp"):  # DSOPT_DDP_DEVICE=cuda: on the GPU
            assert runs[rank][name][mode]["device"].startswith(DEVICE), runs[rank][name][mode]
        alone, hook = runs[rank][name]["alone"], runs[rank][name]["hook"]
        assert hook["losses"] == alone["losses"], f"rank {rank}"
        assert hook["params"] == alone["params"], f"rank {rank}"
    # the replicas agree, and training moved them
    assert runs[0][name]["hook"]["params"] == runs[1][name]["hook"]["params"]
    assert runs[0][name]["alone"]["losses"][-1] < runs[0][name]["alone"]["losses"][0]


@pytest.mark.parametrize("name", NAMES)
def test_hook_sends_what_dsopt_alone_sends(runs, name):
    for rank in range(WORLD):
        alone, hook, ddp = (runs[rank][name][m] for m in ("alone", "hook", "ddp"))
        assert hook["bytes_sent"] == alone["bytes_sent"], f"rank {rank}"
        assert ddp["bytes_sent"] == alone["bytes_sent"], f"rank {rank}"
        dsopt_bytes = sum(alone["bytes_sent"])
        # What the process wrote to its sockets: dsopt's bytes (gloo's
        # framing on top) alone and with the hook; DDP's own allreduce of
        # every fp32 gradient, at least the gradient bytes per step, without.
        grad_bytes = 4 * alone["numel"] * len(alone["losses"])
        assert hook["wrote"] < alone["wrote"] + grad_bytes // 4, (rank, hook["wrote"], alone["wrote"])
        assert ddp["wrote"] > alone["wrote"] + grad_bytes // 2, (rank, ddp["wrote"], alone["wrote"])
        assert alone["wrote"] >= dsopt_bytes // 2


@pytest.mark.parametrize("name", NAMES)
def test_double_reduction_is_reported_once(runs, name):
    for rank in range(WORLD):
        alone, hook, ddp = (runs[rank][name][m] for m in ("alone", "hook", "ddp"))
        assert alone["double_warnings"] == [] and hook["double_warnings"] == []
        assert len(ddp["double_warnings"]) == 1, ddp["double_warnings"]
        assert "ddp_comm_hook" in ddp["double_warnings"][0]
