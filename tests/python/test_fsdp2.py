"""dsopt.torch optimizers on FSDP2 models (docs/guides/fsdp2.md), at 2 and
4 gloo ranks under PyPI's torch (`make test-frameworks`): three launches of
fsdp2_worker.py (2 ranks, then 4 loading the 2-rank checkpoints, then 2
loading the 4-rank ones), each running many checks; the worker's doc says
what each phase does. The CUDA case (NCCL, one rank per GPU) runs where
torch sees a GPU."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401  (FSDP2: torch >= 2.6)
    from torch.distributed.tensor import DTensor  # noqa: F401
except ImportError:
    pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6", allow_module_level=True)

import conftest  # noqa: E402

TOL = 1e-6  # dsopt's fp32 Adam against torch's: rounding, a few ulp over the run


def _launch(phase, world, out, ckpt, **env):
    conftest.wait_for(conftest.start_ranks("fsdp2_worker.py", [phase, out, ckpt], world, **env),
                      f"fsdp2_worker.py {phase}", timeout=300)
    return [json.loads((out / f"{phase}-rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out, ckpt = tmp_path_factory.mktemp("fsdp2_out"), tmp_path_factory.mktemp("fsdp2_ckpt")
    return {"two": _launch("two", 2, out, ckpt), "four": _launch("four", 4, out, ckpt),
            "back": _launch("back", 2, out, ckpt)}


def _diff(a, b):
    return max(float(np.abs(np.array(x) - np.array(y)).max()) for x, y in zip(a, b))


def test_elementwise_rules_update_the_shards_as_the_whole_model_bit_for_bit(runs):
    for rank in runs["two"]:
        for name, found in rank["whole"].items():
            assert found["equal"], (name, found["diff"])
            assert found["moved"] > 1e-3, name  # training moved the parameters
        assert rank["whole_clipped"]["equal"], rank["whole_clipped"]["diff"]


def test_lamb_and_clipping_use_whole_tensor_norms(runs):
    for rank in runs["two"]:
        lamb = rank["lamb"]
        assert lamb["diff"] <= 1e-6, lamb  # the norms' order of addition only
        assert lamb["moved"] > 1e-3
        # one batched allreduce of the per-tensor sums per step, beside the
        # status and norm: 16 bytes, and 12 doubles (2 streams x 6 tensors)
        assert "bytes_sent=112" in lamb["info"], lamb["info"]
        assert "bytes_sent=16" in rank["whole_clipped"]["info"]
        assert "grad_norm=-1.0" not in rank["whole_clipped"]["info"]


def test_optimizers_equal_torch_optim_under_the_same_fsdp2_model(runs):
    for rank in runs["two"]:
        for name, found in rank["torch"].items():
            assert found["diff"] <= TOL and found["loss_diff"] <= 10 * TOL, (name, found)
        assert rank["offload"]["diff"] <= TOL, rank["offload"]
        clipped = rank["torch_clipped"]  # gradient_clipping against torch's clip_grad_norm_
        assert clipped["diff"] <= TOL and clipped["loss_diff"] <= 10 * TOL, clipped


def test_what_has_no_meaning_on_fsdp2_parameters_is_refused_with_the_reason(runs):
    refused = runs["two"][0]["refused"]
    for name in ("onebit", "onebit_lamb", "zero_one_adam"):
        assert refused[name].startswith("ValueError") and "HSDP" in refused[name], refused[name]
        assert "replicas" in refused[name]
    assert "zero_stage 1" in refused["zero"]
    assert "overlap=True" in refused["overlap"]
    assert "plain tensor" in refused["mixed"]
    assert "Shard(dim=0)" in refused["placement"]
    assert "one dsopt optimizer takes parameters of one mesh" in refused["meshes"]
    assert refused["add_param_group"].startswith("RuntimeError")


def test_dcp_resume_at_the_same_world_size_is_bit_for_bit(runs):
    for rank in runs["two"]:
        for name, found in rank["resume"].items():
            assert found["equal"] and found["step"] == found["resumed_step"] == 7, (name, found)
            assert found["fresh_differs"] > 1e-4, (name, found)  # the optimizer's state mattered
    for rank in runs["four"]:
        assert rank["hsdp_resume"] == {"equal": True, "compressed": True}


def test_dcp_reshards_two_to_four_and_four_to_two(runs):
    two, four, back = runs["two"][0], runs["four"][0], runs["back"][0]
    # 2 -> 4 continues the 2-rank run (the same global batches), and equals
    # torch AdamW's own resharded resume to rounding
    assert _diff(four["resharded_dsopt"]["params"], two["continued_dsopt"]["params"]) <= TOL
    assert _diff(four["resharded_dsopt"]["params"], four["resharded_torch"]["params"]) <= TOL
    assert _diff(four["resharded_torch"]["params"], two["continued_torch"]["params"]) <= TOL
    # 4 -> 2
    assert _diff(back["back"]["params"], four["continued_4"]["params"]) <= TOL


def test_dsopt_and_torch_load_each_others_dcp_checkpoints(runs):
    two, four = runs["two"][0], runs["four"][0]
    assert _diff(four["dsopt_from_torch"]["params"], two["continued_torch"]["params"]) <= TOL
    assert _diff(four["torch_from_dsopt"]["params"], two["continued_dsopt"]["params"]) <= TOL


def test_hsdp_runs_the_one_bit_optimizers_across_the_replicas(runs):
    for rank in runs["four"]:
        assert rank["hsdp_grads_differ"]  # FSDP2 all-reduced nothing across the replicas
        for name, found in rank["hsdp"].items():
            assert found["compressed"] and found["finite"] and found["replicas_equal"], (name, found)
            assert found["moved"] > 1e-3, name
            if name != "OneBitLamb":  # 1-bit LAMB's norms are whole tensors', not the shards'
                assert found["equal_to_shards"], name


def test_fsdp2s_own_hsdp_steps_the_shards_and_refuses_the_one_bit_exchange(runs):
    for rank in runs["four"]:
        native = rank["native_hsdp"]
        assert native["diff"] <= TOL, native
        assert "FSDP2's own HSDP" in native["onebit"] and "mesh['shard']" in native["onebit"]
        assert native["comm"].startswith("ValueError") and "leave comm None" in native["comm"]


def test_one_bit_state_at_another_topology_resets_with_a_warning(runs):
    for rank in runs["back"]:
        found = rank["onebit_other_topology"]
        assert len(found["warnings"]) == 1 and "[2, 2], here [2, 1]" in found["warnings"][0]
        assert found["compressed"] and found["finite"] and found["step"] == 9


def test_cuda_over_nccl(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no GPU: the CUDA case of FSDP2 runs with the GPU suite")
    world = min(2, torch.cuda.device_count())
    [rank, *_] = _launch("cuda", world, tmp_path, tmp_path, DSOPT_FSDP2_DEVICE="cuda")
    assert all(found["equal"] for found in rank["whole"].values()), rank["whole"]
    assert rank["lamb"]["diff"] <= 1e-6
    assert rank["torch"]["AdamW"]["diff"] <= TOL
    assert rank["offload"]["diff"] <= TOL and rank["offload"]["param_device"] == "cpu"
    assert rank["resume"]["AdamW"]["equal"]
    assert rank["state_device"].startswith("cuda")


# What every section of dsopt's state blobs holds (src/state/, the
# algorithms' describe_state): the FSDP2 state dicts keep the common ones
# once, the rank-local ones per rank and the per-element ones as DTensors.
# A section not listed here is one _blob.section_kind has not been told of.
_KINDS = {
    "common": {"common.steps", "common.lr", "common.loss_scaler", "common.run",
               "common.param_steps", "common.hyper", "common.divergence",
               "onebit.stage", "onebit.stabilize", "onebit.rule", "onebit.units", "onebit.topology",
               "lamb.stage", "lamb.coefficients", "lamb.units", "lamb.topology",
               "zoadam.schedule", "zoadam.interval", "zoadam.rule", "zoadam.units", "zoadam.topology"},
    "rank_local": {"onebit.worker_error", "onebit.server_error", "lamb.worker_error",
                   "lamb.server_error", "lamb.momentum_tail", "zoadam.worker_error",
                   "zoadam.server_error", "zoadam.accumulator", "zoadam.anchor"},
    "per_element": {"common.masters", "adam.exp_avg", "adam.exp_avg_sq", "lamb.exp_avg",
                    "lamb.exp_avg_sq", "lamb.exp_avg_sq_fresh", "lion.exp_avg",
                    "sgd.momentum_buffer", "onebit.exp_avg", "onebit.exp_avg_sq",
                    "zoadam.exp_avg", "zoadam.exp_avg_sq"},
}


@pytest.mark.parametrize("algorithm", ["Adam", "AdamW", "Lamb", "Lion", "SGD", "OneBitAdam",
                                       "OneBitLamb", "ZeroOneAdam"])
def test_every_blob_section_is_known_to_the_fsdp2_state_dicts(algorithm):
    import dsopt
    from dsopt.torch._blob import Blob, section_kind

    assert algorithm in dsopt.algorithm_names()
    params = [np.ones(5, np.float32), np.ones(3, np.float16)]
    with dsopt.Optimizer({"optimizer": {"type": algorithm, "params": {"lr": 1e-3}}}, params) as opt:
        opt.step([np.full(5, 0.1, np.float32), np.full(3, 0.1, np.float16)])
        names = Blob(opt.state_dict()).sections
    known = {name: kind for kind, names_ in _KINDS.items() for name in names_}
    assert set(names) <= set(known), set(names) - set(known)
    for name in names:
        assert section_kind(name) == known[name], name


def test_all_algorithms_are_classified():
    import dsopt

    assert sorted(dsopt.algorithm_names()) == sorted(
        test_every_blob_section_is_known_to_the_fsdp2_state_dicts.pytestmark[0].args[1])
