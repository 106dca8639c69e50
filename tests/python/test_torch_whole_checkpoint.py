"""Whole checkpoints of dsopt.torch optimizers at 2 gloo ranks
(whole_checkpoint_worker.py): ``state_dict_all_ranks()`` saved from rank 0
only, as frameworks save, and loaded from that one file on every rank,
resumes bit for bit at the same world size (AdamW, ZeRO-2, 1-bit Adam in
its compressed stage: every rank gets its own shard and compression
errors back; AdamW over a model cast to bf16 just before the save), and a ZeRO-2 run saved at 2 ranks continues at 1. Rank 0's
own 1-bit state dict is refused on rank 1, and loads with
``reset_rank_local=True``, which warns.

Needs torch and scikit-learn (`make test-frameworks`)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import conftest  # noqa: E402

NAMES = ("adamw", "adamw_zero2", "onebit_adam", "adamw_cast")


def launch(world, *args):
    conftest.wait_for(conftest.start_ranks("whole_checkpoint_worker.py", args, world),
                      f"whole_checkpoint_worker.py {args}", timeout=180)


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    """Every optimizer saved and resumed at 2 ranks (one launch)."""
    out = tmp_path_factory.mktemp("whole_checkpoint")
    launch(2, ",".join(NAMES + ("foreign",)), out)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_resume_from_rank_zeros_file_is_bit_identical(out_dir, name):
    for rank in range(2):
        run = json.loads((out_dir / f"{name}-2-rank{rank}.json").read_text())
        assert run["resumed"] == run["uninterrupted"], f"rank {rank}"
        assert run["resumed"]["losses"][-1] < np.log(10)  # below chance: it trained


def test_zero2_saved_at_two_ranks_continues_at_one(out_dir):
    launch(1, "adamw_zero2", out_dir, 2)
    at_one = json.loads((out_dir / "adamw_zero2-2-at-1-rank0.json").read_text())["resumed"]
    at_two = json.loads((out_dir / "adamw_zero2-2-rank0.json").read_text())["uninterrupted"]
    # The same global batches and state: equal up to the order of the sums.
    np.testing.assert_allclose(at_one["params"], at_two["params"], rtol=0, atol=2e-6)


def test_another_ranks_state_dict_is_refused_or_reset_on_request(out_dir):
    runs = [json.loads((out_dir / f"foreign-rank{rank}.json").read_text()) for rank in range(2)]
    for rank, run in enumerate(runs):
        # Loading is collective: every rank fails, rank 1 naming the cause.
        assert run["refused"] is not None and run["unchanged_by_refusal"], f"rank {rank}"
        assert len(run["warnings"]) == 1 and "reset" in run["warnings"][0], run["warnings"]
    assert "rank 0" in runs[1]["refused"] and "reset_rank_local" in runs[1]["refused"]
    assert runs[0]["params"] == runs[1]["params"]  # the replicas still agree
    assert max(runs[0]["losses"]) < np.log(10)
