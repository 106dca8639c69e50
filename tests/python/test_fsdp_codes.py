"""dsopt.torch.fsdp: dsopt's codes as FSDP2's reduce-scatter and
all-gather, over gloo on the CPU (fsdp_codes_worker.py), at 2 ranks
(collectives, refusals, resume) and at 4 (collectives, the GPT trained
uncompressed and compressed, HSDP on a 2 x 2 mesh): one process launch
per world size.

* The collectives give what the numpy reference of compressed ZeRO's
  codes gives (compressed_zero_reference.py): every rank's output and
  residual bytes for each gradient codec over two calls, every rank's
  all-gather output for each parameter codec, and the bytes counted.
* The GPT of examples/python/gpt.py trained under FSDP2 with int4
  gradients and int8 parameters ends within max(1.05x, +0.01) of
  uncompressed FSDP2's loss (the mean of the last 5 steps, same batches)
  and sends at least 3.5x fewer bytes per step, as the guide's formulas
  say, module by module.
* A checkpoint through torch.distributed.checkpoint (model, AdamW, the
  residuals) resumes bit for bit.
* With 2 GPUs (NCCL) the collectives on CUDA tensors pass the same checks.
* What compress refuses, it refuses on every module before installing
  anything, with a message naming the cause; what falls back at run time
  warns once per reason and stays exact.

Needs PyPI's torch with FSDP2 (`make test-frameworks`)."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:
    pytest.skip(f"torch {torch.__version__} has no FSDP2 (fully_shard)", allow_module_level=True)

import conftest  # noqa: E402
import compressed_zero_reference as ref  # noqa: E402
from fsdp_codes_worker import GRAD_BLOCK, PARAM_BLOCK  # noqa: E402

F32 = np.float32
STEPS = 30
TAIL = 5  # the final loss: the mean of the last TAIL steps


def launch(tmp_path_factory, world, checks, device="cpu"):
    out_dir = tmp_path_factory.mktemp(f"fsdp_codes_{world}_{device}")
    procs = conftest.start_ranks("fsdp_codes_worker.py", [out_dir, ",".join(checks)], world,
                                 DSOPT_FSDP_STEPS=str(STEPS), DSOPT_FSDP_CKPT=str(out_dir / "ckpt"),
                                 DSOPT_FSDP_DEVICE=device)
    conftest.wait_for(procs, f"fsdp_codes_worker.py at {world} ranks", timeout=300)
    return ([json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)],
            [dict(np.load(out_dir / f"rank{r}.npz")) for r in range(world)])


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return launch(tmp_path_factory, 2, ["collectives", "refusals", "resume"])


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return launch(tmp_path_factory, 4, ["collectives", "train", "hsdp"])


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    if torch.cuda.device_count() < 2:
        pytest.skip("the CUDA collectives (NCCL, one GPU per rank) need 2 GPUs")
    return launch(tmp_path_factory, 2, ["collectives"], device="cuda")


@pytest.fixture(params=["two", "four", "two_gpus"])
def ranks(request):
    return request.getfixturevalue(request.param)


# ---- the collectives against the numpy reference ---------------------------------------

@pytest.mark.parametrize("codec", ["int8", "int4", "sign"])
def test_reduce_scatter_is_the_reference(ranks, codec):
    results, arrays = ranks
    world = len(arrays)
    m = len(arrays[0][f"rs_{codec}_0_out"])
    residuals = [np.zeros(world * m, F32) for _ in range(world)]
    for call, average in ((0, True), (1, False)):
        inputs = [a[f"rs_{codec}_{call}_in"] for a in arrays]
        for owner in range(world):
            piece = slice(owner * m, (owner + 1) * m)
            acc = None
            for r in range(world):  # rank order
                d, residuals[r][piece] = ref.with_feedback(codec, GRAD_BLOCK, inputs[r][piece],
                                                           residuals[r][piece])
                acc = d if acc is None else (acc + d).astype(F32)
            if average:
                acc = (acc / F32(world)).astype(F32)
            np.testing.assert_array_equal(arrays[owner][f"rs_{codec}_{call}_out"], acc,
                                          err_msg=f"call {call}, rank {owner}")
        for r in range(world):  # the residual's bytes: the int8 codes of what was lost
            saved = arrays[r][f"rs_{codec}_{call}_residual"]
            decoded = np.concatenate([ref.decode("int8", GRAD_BLOCK, saved[o * len(saved) // world:],
                                                 m) for o in range(world)])
            np.testing.assert_array_equal(decoded, residuals[r], err_msg=f"call {call}, rank {r}")
    for r in range(world):
        assert results[r]["collectives"][f"rs_{codec}_bytes"] == 2 * (world - 1) * ref.run_bytes(codec, GRAD_BLOCK, m)


@pytest.mark.parametrize("codec", ["bf16", "int8"])
def test_all_gather_is_the_reference(ranks, codec):
    results, arrays = ranks
    world = len(arrays)
    shards = [a[f"ag_{codec}_in"] for a in arrays]
    expected = np.concatenate([ref.param_codec(codec, PARAM_BLOCK, s) for s in shards])
    n = len(shards[0])
    for r in range(world):
        np.testing.assert_array_equal(arrays[r][f"ag_{codec}_out"], expected)
        size = 2 * n if codec == "bf16" else ref.run_bytes("int8", PARAM_BLOCK, n)
        assert results[r]["collectives"][f"ag_{codec}_bytes"] == (world - 1) * size


def test_forward_sees_decoded_shards_optimizer_keeps_exact_ones(ranks):
    results, arrays = ranks
    world = len(arrays)
    full, seen = arrays[0]["unsharded_full"], arrays[0]["unsharded_seen"]
    rows = full.shape[0] // world
    expected = np.concatenate([ref.param_codec("int8", PARAM_BLOCK, full[r * rows:(r + 1) * rows].ravel())
                               for r in range(world)]).reshape(full.shape)
    for r in range(world):
        np.testing.assert_array_equal(arrays[r]["unsharded_seen"], expected)
        assert results[r]["collectives"]["unsharded"]["shard_exact"]
    assert not np.array_equal(seen, full)


def test_run_time_fallbacks_are_exact_and_warned_once(ranks):
    results, arrays = ranks
    world = len(arrays)
    for r in range(world):
        report = results[r]["collectives"]["fallbacks"]
        assert report["bf16_exact"] and report["max_exact"]
        assert report["uncompressed_calls"] == 4 and report["residual_zero"]
        assert len(report["warnings"]) == 2, report["warnings"]
        assert "bfloat16" in report["warnings"][0] and "blocks.0" in report["warnings"][0]
        assert "MAX" in report["warnings"][1] or "max" in report["warnings"][1].lower()
        m = len(arrays[0]["rs_int4_0_out"])
        assert report["bytes"] == 2 * (world - 1) * m * 2 + 2 * (world - 1) * m * 4


# ---- refusals and checkpoints (2 ranks) ------------------------------------------------

REFUSALS = {
    "not_sharded": ("TypeError", "fully_shard"),
    "bad_name": ("ValueError", "int2"),
    "bad_block": ("ValueError", "gradient_block_size"),
    "param_dtype": ("ValueError", "param_dtype"),
    "reduce_dtype": ("ValueError", "reduce_dtype"),
    "bf16_params": ("ValueError", "torch.bfloat16"),
    "divide_factor": ("ValueError", "divide factor"),
    "twice": ("ValueError", "compressed already"),
    "two_groups": ("ValueError", "2 FSDP parameter groups"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_compress_refuses_with_the_cause(two, case):
    results, _ = two
    kind, words = REFUSALS[case]
    for r in range(len(results)):
        message = results[r]["refusals"][case]
        assert message is not None and message.startswith(kind) and words in message, message


def test_a_refusal_installs_nothing_and_remove_undoes(two):
    results, _ = two
    for r in range(len(results)):
        report = results[r]["refusals"]
        assert report["nothing_installed"]
        assert report["after_remove"] is None
        assert report["bf16_gather_grads_only"] is None


def test_checkpoint_resumes_bit_for_bit(two):
    results, _ = two
    for r in range(len(results)):
        report = results[r]["resume"]
        assert report["residual_nonzero"] and report["residual_loaded"]
        assert report["resumed"] == report["straight"]
        assert report["params_equal"] and report["residuals_equal"]
        assert "gradient_block_size" in report["bad_load"]


# ---- training (4 ranks) -----------------------------------------------------------------

def test_compressed_fsdp2_trains_as_uncompressed(four):
    results, _ = four
    runs = results[0]["train"]
    base, codes = runs["None/None"], runs["int4/int8"]
    final_base = np.mean(base["losses"][-TAIL:])
    final_codes = np.mean(codes["losses"][-TAIL:])
    assert final_base < base["losses"][0] - 1.0, base["losses"]  # it trained
    assert final_codes <= max(1.05 * final_base, final_base + 0.01), (final_codes, final_base)
    for r in range(len(results)):
        assert results[r]["train"]["int4/int8"]["losses"] == codes["losses"]
        assert results[r]["train"]["int4/int8"]["uncompressed_calls"] == 0
        assert results[r]["train"]["int4/int8"]["warnings"] == []


def test_compressed_fsdp2_sends_the_formula_bytes(four):
    results, _ = four
    world = len(results)
    for r in range(world):
        base, codes = results[r]["train"]["None/None"], results[r]["train"]["int4/int8"]
        assert len(set(base["bytes"])) == 1 and len(set(codes["bytes"])) == 1
        ratio = base["bytes"][-1] / codes["bytes"][-1]
        assert ratio >= 3.5, ratio
        for name, m in codes["shard_numels"].items():
            b_rs, b_ag = base["modules"][name]
            c_rs, c_ag = codes["modules"][name]
            assert b_rs == STEPS * (world - 1) * 4 * m
            assert c_rs == STEPS * (world - 1) * ref.run_bytes("int4", 64, m)
            gathers = b_ag // ((world - 1) * 4 * m)
            assert gathers >= STEPS and b_ag == gathers * (world - 1) * 4 * m
            assert c_ag == gathers * (world - 1) * ref.run_bytes("int8", 256, m)
        # the residual: P int8 runs of the shard per module
        assert codes["residual_bytes"] == sum(world * ref.run_bytes("int8", 64, m)
                                              for m in codes["shard_numels"].values())
        # what the process wrote to its sockets fell with them
        assert codes["wrote"] < base["wrote"] / 2, (codes["wrote"], base["wrote"])


def test_hsdp_trains_compressed(four):
    results, _ = four
    for r in range(len(results)):
        run = results[r]["hsdp"]["run"]
        assert np.mean(run["losses"][-TAIL:]) < run["losses"][0] - 0.5, run["losses"]
        assert run["uncompressed_calls"] == 0 and run["residual_bytes"] > 0
        assert run["losses"] == results[0]["hsdp"]["run"]["losses"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: the CUDA codecs run with the GPU suite")
def test_cuda_codec_on_a_stream_matches_the_cpu():
    """The codec of the CUDA collectives on one GPU, its work on a side
    stream as FSDP2's (the collectives themselves at 2 GPUs: two_gpus)."""
    import dsopt
    for name in ("int8", "int4", "sign"):
        cpu, gpu = dsopt.Codec(name, block=GRAD_BLOCK), dsopt.Codec(name, block=GRAD_BLOCK, device="cuda")
        x = torch.randn(4 * 100)
        e_cpu = torch.zeros(4 * cpu.residual_size(100), dtype=torch.uint8)
        e_gpu = e_cpu.cuda()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            gpu.set_stream(stream)
            codes = gpu.encode(x.cuda(), runs=4, residual=e_gpu)
            total = gpu.decode_sum(codes, n=100, runs=4)
        stream.synchronize()
        assert codes.cpu().numpy().tobytes() == cpu.encode(x, runs=4, residual=e_cpu).numpy().tobytes()
        assert torch.equal(e_gpu.cpu(), e_cpu)
        assert torch.equal(total.cpu(), cpu.decode_sum(codes.cpu(), n=100, runs=4))
