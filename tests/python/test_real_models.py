"""1-bit Adam, 1-bit LAMB, 0/1 Adam and ZeRO-2 AdamW on three small real
models (examples/python/small_models.py): the digits MLP, the next-byte
model on GPL-3 (whose embedding rows of bytes the text never uses never get
a gradient) and the digits CNN (two 3x3 convolutions and a linear layer,
9,930 parameters). User settings: lr 1e-3, weight_decay 0.01, global batch
64, 300 steps, freeze_step 45 (15%).

* stabilized (the default): no skipped step, the same parameters on every
  rank, and a final training loss within 1.5x of the same update rule
  without compression (OneBitAdam with freeze_step after the run), on 4
  ranks and (the digits models) on one;
* DeepSpeed's rule ("stabilize" and "bias_correction" false) on 4 ranks
  (MLP, next-byte model): it may fail, but only as skipped steps or
  dsopt.NonFiniteError: no crash, no hang.

1-bit LAMB runs the same checks with lr 1e-2 (LAMB's trust ratio scales the
step down to about ||p|| / ||update|| of each tensor), against LAMB without
compression (OneBitLamb with freeze_step after the run); on the CNN, where
LAMB without compression ends far below AdamW (0.028 against 0.103, seed 0)
and 1-bit LAMB where AdamW ends, within 4x.

0/1 Adam (var_freeze_step 45, training_runs.zoadam_config's schedules):
stabilized, no skipped step and a final training loss within 1.5x of
AdamW's, on 4 ranks and (the digits models) on one; the ranks' parameters
agree after the last step that is not local; DeepSpeed's rule may fail only
by skipping or NonFiniteError, the same on every rank.

AdamW under ZeRO stage 2 (buckets of 4,096 elements, smaller than the
models' largest tensors) ends where AdamW ends, on 4 ranks and on one, on
the MLP and the next-byte model, without a skipped step. With compressed
traffic (int4 gradients and int8 parameters for AdamW on all three models,
sign/int8 on the digits models, int8 both for LAMB on the MLP and the
next-byte model; error feedback on) it trains, with the same parameters
on every rank, AdamW int4/int8 to at most 5% above uncompressed ZeRO-2 and
sign/int8 to at most 1.35x (MLP) or 1.6x (CNN) of it (one seed), with 3x
(AdamW) or 1.25x (LAMB, whose trust ratios exchange cut sum blocks
uncompressed) fewer bytes on 4 ranks, and is uncompressed ZeRO-2 on one.

LAMB (lr 1e-2, bias-corrected) trains the MLP and the next-byte model to
under half their first loss, on 4 ranks and on one; under ZeRO stage 2 it
ends where it ends (bit for bit on one rank, fp32 rounding of the gradient
sums apart on 4); without bias correction it is 1-bit LAMB's warmup rule
bit for bit.

Divergence that stays finite (StepInfo.diverging, docs/reference/c-api.md "Divergence that
stays finite"): never reported on any of the healthy runs above, the same
on every rank of every run, and reported within a few steps of a blow-up
whose gradient norm jumps by orders of magnitude with every value finite
(1-bit Adam with DeepSpeed's rule, lr 1e-2, freeze_step 10), before any
step is skipped.

With the hierarchy on (the 4 ranks declared as 2 nodes of 2: "topology":
{"hierarchy": "node_aware", "ranks_per_node": 2}, docs/guides/multi-node.md)
the stabilized 1-bit Adam, 1-bit LAMB and 0/1 Adam (all three models, with
the fp32 node step and with the 1-bit one, "node_reduce": "1bit") and
compressed ZeRO-2 int4/int8 and sign/int8 (the digits models) pass the
flat form's checks: no skipped step, the same parameters on every rank,
the flat form's loss limits, the flat form's phases (1-bit family) and at
most 0.55 of its bytes across nodes (ZeRO).

All 4-rank runs share one ``mpirun -np 4`` of mpi_real_models.py (a launch
costs seconds on the 2-core machine); each one-rank run is made once per
session (one_rank)."""

import statistics
import sys

import pytest

import conftest
from dsopt_testing import skip_unless_mpi_runs

sys.path.insert(0, str(conftest.REPO_ROOT / "examples" / "python"))
import training_runs  # noqa: E402
from training_runs import (RunSpec, adamw_config, lamb_config, onebit_config, plain_lamb_config,  # noqa: E402
                           zoadam_config)
import divergence_rule  # noqa: E402

WORKER = conftest.HERE / "mpi_real_models.py"
MODELS = ["digits", "chars"]
STEPS = 300
FREEZE_STEP = int(0.15 * STEPS)
LOSS_RATIO_LIMIT = 1.5
RUNS = {
    "uncompressed": onebit_config(freeze_step=100000),  # never leaves warmup within the run
    "stabilized": onebit_config(freeze_step=FREEZE_STEP),
    "deepspeed_rule": onebit_config(freeze_step=FREEZE_STEP, stabilize=False, bias_correction=False),
    "lamb_uncompressed": lamb_config(freeze_step=100000),
    "lamb_stabilized": lamb_config(freeze_step=FREEZE_STEP),
    "lamb_deepspeed_rule": lamb_config(freeze_step=FREEZE_STEP, stabilize=False),
    "adamw": adamw_config(),
    "lamb": plain_lamb_config(),
    "lamb_zero2": plain_lamb_config(zero_stage=2),
    "zero2": dict(adamw_config(), zero_optimization={"stage": 2, "reduce_bucket_size": 4096,
                                                     "allgather_bucket_size": 4096}),
    "zero2_int4_int8": dict(adamw_config(), zero_optimization={
        "stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "compression": {"gradients": "int4", "parameters": "int8"}}),
    "lamb_zero2_int8": dict(plain_lamb_config(zero_stage=2), zero_optimization={
        "stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "compression": {"gradients": "int8", "parameters": "int8"}}),
    # Compressed ZeRO sign/int8, and node-aware compressed ZeRO
    # (docs/design/node-aware-zero.md: the 4 ranks declared as 2 nodes x 2):
    # the digits models only.
    "zero2_int4_int8_2x2": dict(adamw_config(), topology={"hierarchy": "node_aware", "ranks_per_node": 2},
                                zero_optimization={
        "stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "compression": {"gradients": "int4", "parameters": "int8"}}),
    "zero2_sign_int8": dict(adamw_config(), zero_optimization={
        "stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "compression": {"gradients": "sign", "parameters": "int8"}}),
    "zero2_sign_int8_2x2": dict(adamw_config(), topology={"hierarchy": "node_aware", "ranks_per_node": 2},
                                zero_optimization={
        "stage": 2, "reduce_bucket_size": 4096, "allgather_bucket_size": 4096,
        "compression": {"gradients": "sign", "parameters": "int8"}}),
    "zoadam_stabilized": zoadam_config(FREEZE_STEP),
    "zoadam_deepspeed_rule": zoadam_config(FREEZE_STEP, stabilize=False, bias_correction=False),
    "blowup": dict(onebit_config(freeze_step=10, lr=1e-2, stabilize=False, bias_correction=False),
                   report_grad_norm=True),
}
# The 1-bit optimizers' compressed allreduce node-aware, the 4 ranks as 2 nodes of 2.
# "_2x2_1bit": the same with the 1-bit node step ("node_reduce": "1bit").
NODE_AWARE = {"hierarchy": "node_aware", "ranks_per_node": 2}
NODE_STEPS = {"_2x2": NODE_AWARE, "_2x2_1bit": dict(NODE_AWARE, node_reduce="1bit")}
RUNS.update({f"{name}{suffix}": dict(RUNS[name], topology=topology)
             for name in ("stabilized", "lamb_stabilized", "zoadam_stabilized")
             for suffix, topology in NODE_STEPS.items()})


DIGITS_ONLY = {"zero2_sign_int8", "zero2_int4_int8_2x2", "zero2_sign_int8_2x2"}
# The digits CNN runs the convergence checks of the compressed optimizers,
# flat and 2 x 2, and their references only.
CNN = "digits_cnn"
CNN_RUNS = {"uncompressed", "stabilized", "lamb_uncompressed", "lamb_stabilized", "adamw", "zoadam_stabilized",
            "zero2", "zero2_int4_int8", "zero2_sign_int8", "stabilized_2x2", "lamb_stabilized_2x2",
            "zoadam_stabilized_2x2", "stabilized_2x2_1bit", "lamb_stabilized_2x2_1bit",
            "zoadam_stabilized_2x2_1bit", "zero2_int4_int8_2x2", "zero2_sign_int8_2x2"}


def runs_of(model):
    if model == CNN:
        return CNN_RUNS
    return {run for run in RUNS if model == "digits" or run not in DIGITS_ONLY}


def specs_for(models, runs=None):
    return [RunSpec(f"{model}/{run}", model, config, steps=STEPS, batch=64, seed=0)
            for model in models for run, config in RUNS.items()
            if run in runs_of(model) and (runs is None or run in runs)]


_LOCAL = {}  # name -> RunResult of the one-rank runs made so far (each run is deterministic)


def one_rank(model, runs):
    """{run: RunResult} of `runs` of `model` on one rank, each run made once
    per test session."""
    todo = [s for s in specs_for([model], runs) if s.name not in _LOCAL]
    _LOCAL.update(training_runs.run_local(todo) if todo else {})
    return {run: _LOCAL[f"{model}/{run}"] for run in runs}


def assert_ranks_agree(results, where):
    """Every rank ends with the same parameters, bit for bit."""
    for rank, result in enumerate(results):
        assert result.params_digest == results[0].params_digest, f"{where}: rank {rank}'s parameters differ"


@pytest.fixture(scope="module")
def four_ranks():
    """get(name) -> [RunResult of each rank] of the one mpirun -np 4; a run
    that did not finish on every rank fails the test that asks for it."""
    skip_unless_mpi_runs(training_runs.mpi_available())
    try:
        results, failure = training_runs.run_under_mpirun([WORKER], specs_for(MODELS + [CNN]), 4, timeout=400), None
    except training_runs.MpirunFailed as e:
        results, failure = e.finished, e

    def get(name):
        if name not in results:
            pytest.fail(f"{name} did not finish on every rank (crash or hang): {failure}")
        return results[name]
    return get


def assert_converges_like_uncompressed(compressed, uncompressed, where, limit=LOSS_RATIO_LIMIT):
    """`uncompressed`: the same rule without compression (1-bit Adam) or AdamW (0/1 Adam)."""
    assert not compressed.error, f"{where}: {compressed.error}"
    assert compressed.skipped == 0, f"{where}: {compressed.skipped} steps skipped"
    for run in (compressed, uncompressed):
        assert not any(run.diverging), f"{where}: healthy run reported diverging at steps " \
            f"{[k + 1 for k, flag in enumerate(run.diverging) if flag]}"
    assert compressed.train_loss <= limit * uncompressed.train_loss, \
        f"{where}: final training loss {compressed.train_loss:.4f}, uncompressed {uncompressed.train_loss:.4f}"


# optimizer -> (stabilized run, its uncompressed reference, DeepSpeed's rule,
# most of the reference's bytes the stabilized run may send)
OPTIMIZERS = {
    "1-bit Adam": ("stabilized", "uncompressed", "deepspeed_rule", 0.3),
    "1-bit LAMB": ("lamb_stabilized", "lamb_uncompressed", "lamb_deepspeed_rule", 0.3),
    "0/1 Adam": ("zoadam_stabilized", "adamw", "zoadam_deepspeed_rule", 0.2),
}
# (model, optimizer) -> its loss limit where it is not LOSS_RATIO_LIMIT.
# 1-bit LAMB on the CNN ends where AdamW ends (0.088-0.091 against 0.102-0.103,
# seeds 0-2), but uncompressed LAMB ends far below both (0.028, 0.028, 0.052):
# 3.3x, 3.3x and 1.7x of it on 4 ranks, 3.5x, 3.4x and 1.6x at 2 x 2; 1.7x
# (seed 0) on one rank.
LOSS_RATIO_LIMITS = {("digits_cnn", "1-bit LAMB"): 4.0}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", MODELS + [CNN])
def test_stabilized_rule_converges_on_4_ranks(model, optimizer, four_ranks):
    stable, reference, _, bytes_fraction = OPTIMIZERS[optimizer]
    stabilized, uncompressed = four_ranks(f"{model}/{stable}"), four_ranks(f"{model}/{reference}")
    for rank, result in enumerate(stabilized):
        assert not result.error and result.skipped == 0, f"{model}, {optimizer}, rank {rank}: {result}"
    assert_ranks_agree(stabilized, f"{model}, {optimizer}")
    assert_converges_like_uncompressed(stabilized[0], uncompressed[0], f"{model}, {optimizer}, 4 ranks",
                                       LOSS_RATIO_LIMITS.get((model, optimizer), LOSS_RATIO_LIMIT))
    # The compressed stages really ran: most steps at ~1/32 of the bytes (or none).
    sent, sent_uncompressed = (sum(r.bytes_sent for r in rs) for rs in (stabilized, uncompressed))
    assert sent < bytes_fraction * sent_uncompressed, (sent, sent_uncompressed)


@pytest.mark.parametrize("node_step", NODE_STEPS)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", MODELS + [CNN])
def test_node_aware_hierarchy_converges_on_2_nodes_of_2(model, optimizer, node_step, four_ranks):
    """"topology": {"hierarchy": "node_aware", "ranks_per_node": 2}: the
    compressed allreduce averages inside each node first, uncompressed
    (with "node_reduce": "1bit" from 1-bit codes), and compresses across the
    two nodes only (docs/design/node-aware-allreduce.md); the stabilized
    rule converges as the flat form does: no skipped step, the ranks agree,
    a final training loss within 1.5x of the uncompressed rule's."""
    stable, reference, _, _ = OPTIMIZERS[optimizer]
    node_aware, uncompressed = four_ranks(f"{model}/{stable}{node_step}"), four_ranks(f"{model}/{reference}")
    for rank, result in enumerate(node_aware):
        assert not result.error and result.skipped == 0, f"{model}, {optimizer} {node_step}, rank {rank}: {result}"
    assert_ranks_agree(node_aware, f"{model}, {optimizer} {node_step}")
    assert_converges_like_uncompressed(node_aware[0], uncompressed[0], f"{model}, {optimizer}, 2 x 2",
                                       LOSS_RATIO_LIMITS.get((model, optimizer), LOSS_RATIO_LIMIT))
    assert node_aware[0].phases == four_ranks(f"{model}/{stable}")[0].phases


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", MODELS)
def test_deepspeed_rule_fails_only_by_skipping_on_4_ranks(model, optimizer, four_ranks):
    """DeepSpeed's rule gives coordinates with v ~ 0 steps of +-scale/eps;
    where it diverges, dsopt turns the Inf/NaN gradients into skipped steps
    and, after max_consecutive_skips, NonFiniteError (naming "stabilize") on
    every rank at the same step, never a crash or a hang. 1-bit Adam
    diverges on both models."""
    results = four_ranks(f"{model}/{OPTIMIZERS[optimizer][2]}")
    assert len({(r.skipped, r.error_step, bool(r.error)) for r in results}) == 1, \
        f"{model}, {optimizer}: the ranks disagree: {[(r.skipped, r.error_step, r.error) for r in results]}"
    for r in results:
        assert not r.error or "stabilize" in r.error, r.error
        assert r.diverging == results[0].diverging, f"{model}, {optimizer}: the ranks report divergence differently"
    if optimizer == "1-bit Adam":
        assert any(r.skipped > 0 or r.error for r in results), f"{model}: DeepSpeed's rule did not fail here"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("model", ["digits", CNN])
def test_stabilized_rule_converges_on_1_rank(model, optimizer):
    stable, reference, deepspeed, _ = OPTIMIZERS[optimizer]
    results = one_rank(model, [run for run in (stable, reference, deepspeed) if run in runs_of(model)])
    assert_converges_like_uncompressed(results[stable], results[reference], f"{model}, {optimizer}, 1 rank",
                                       LOSS_RATIO_LIMITS.get((model, optimizer), LOSS_RATIO_LIMIT))
    # DeepSpeed's rule on one rank (the MLP): reported as an error, or it ran every step.
    if deepspeed in results:
        ds = results[deepspeed]
        assert ds.error or len(ds.losses) == STEPS, ds


def blow_up_onset(norms):
    """The first step (from 1) after the first 10 whose norm is over 100x
    the median of the finite norms before it."""
    for k in range(11, len(norms) + 1):
        before = [n for n in norms[:k - 1] if n == n]
        if norms[k - 1] > 100.0 * statistics.median(before):
            return k
    return None


def assert_blow_up_reported(result, where, world):
    """Reported as the rule says, within a few steps of the onset and
    before any step was skipped (every value was still finite)."""
    flags, _ = divergence_rule.replay(result.grad_norms, divergence_rule.local_steps(result.phases, world), world)
    assert result.diverging == [int(f) for f in flags], where
    onset = blow_up_onset(result.grad_norms)
    assert onset is not None, f"{where}: no blow-up: {result.grad_norms[:40]}"
    first = result.diverging.index(1) + 1
    assert onset <= first <= onset + 3, f"{where}: blow-up at step {onset}, first reported at {first}"
    skipped = [k + 1 for k, n in enumerate(result.grad_norms) if n != n]
    assert not skipped or first < skipped[0], f"{where}: reported at {first}, first skip at {skipped[0]}"


def test_a_finite_blow_up_is_reported_on_4_ranks(four_ranks):
    results = four_ranks("chars/blowup")
    for rank, r in enumerate(results):
        assert r.diverging == results[0].diverging and r.grad_norms == results[0].grad_norms, f"rank {rank}"
    assert_blow_up_reported(results[0], "chars, 4 ranks", 4)


def test_a_finite_blow_up_is_reported_on_1_rank():
    spec = next(s for s in specs_for(["digits"]) if s.name == "digits/blowup")
    assert_blow_up_reported(training_runs.run_local([spec])[spec.name], "digits, 1 rank", 1)


@pytest.mark.parametrize("model", MODELS)
def test_zero2_trains_like_adamw(model, four_ranks):
    """ZeRO-2 is AdamW with sharded state: on 4 ranks its sums run in
    another order (fp32 rounding apart), on one rank it is bit for bit."""
    zero2, adamw = four_ranks(f"{model}/zero2"), four_ranks(f"{model}/adamw")
    for rank, result in enumerate(zero2):
        assert not result.error and result.skipped == 0, f"{model}, ZeRO-2, rank {rank}: {result}"
        assert not any(result.diverging) and not any(adamw[rank].diverging), f"{model}, rank {rank}"
    assert abs(zero2[0].train_loss - adamw[0].train_loss) <= 1e-3 * adamw[0].train_loss, \
        (zero2[0].train_loss, adamw[0].train_loss)
    assert zero2[0].train_loss < 0.5 * zero2[0].losses[0], (zero2[0].train_loss, zero2[0].losses[0])
    local = one_rank(model, ["zero2", "adamw"])
    assert local["zero2"].train_loss == local["adamw"].train_loss
    assert local["zero2"].losses == local["adamw"].losses


@pytest.mark.parametrize("model", MODELS)
def test_lamb_trains_and_zero2_ends_where_it_ends(model, four_ranks):
    lamb, zero2 = four_ranks(f"{model}/lamb"), four_ranks(f"{model}/lamb_zero2")
    for rank, (a, b) in enumerate(zip(lamb, zero2)):
        for what, result in (("LAMB", a), ("LAMB ZeRO-2", b)):
            assert not result.error and result.skipped == 0, f"{model}, {what}, rank {rank}: {result}"
            assert not any(result.diverging), f"{model}, {what}, rank {rank}"
    assert lamb[0].train_loss < 0.5 * lamb[0].losses[0], (lamb[0].train_loss, lamb[0].losses[0])
    assert abs(zero2[0].train_loss - lamb[0].train_loss) <= 1e-3 * lamb[0].train_loss, \
        (zero2[0].train_loss, lamb[0].train_loss)
    local = one_rank(model, ["lamb_zero2", "lamb"])
    assert local["lamb_zero2"].losses == local["lamb"].losses
    assert local["lamb"].train_loss < 0.5 * local["lamb"].losses[0]


# LAMB's trust ratios add an uncompressed exchange of the sum blocks that
# 4,096-element buckets cut (docs/guides/compressed-zero.md "Update rules"):
# fewer bytes saved. LAMB at lr 1e-2 on these models ends anywhere between
# 0.7x and 2.8x of its uncompressed loss from seed to seed under any
# perturbation of int8 size (3 seeds, the digits MLP): its runs are checked
# to train, not against a ratio. int4/int8 ends at 1.03-1.14x of ZeRO-2 on
# the CNN (seeds 0-2). sign/int8 (SIGN_LIMITS) ends at 1.14-1.29x of ZeRO-2 on
# the MLP over three seeds (docs/guides/compressed-zero.md "Measured"), at
# 1.30-1.59x on the CNN (seed 0: 1.46x).
SIGN_LIMITS = {"digits": 1.35, CNN: 1.6}


@pytest.mark.parametrize("model,run,plain,fewer,near", [
    *[(model, "zero2_int4_int8", "zero2", 3.0, 1.05) for model in MODELS + [CNN]],
    *[(model, "lamb_zero2_int8", "lamb_zero2", 1.25, None) for model in MODELS],
    *[(model, "zero2_sign_int8", "zero2", 3.0, SIGN_LIMITS[model]) for model in SIGN_LIMITS]])
def test_compressed_zero2_ends_near_zero2(model, run, plain, fewer, near, four_ranks):
    """Compressed traffic with error feedback (docs/guides/compressed-zero.md)
    on 4 ranks: no skipped step, fewer bytes, a final training loss under
    half the first one and (AdamW) at most 5% above uncompressed ZeRO-2's
    (one seed moves by a few percent either way; the mean over seeds is
    within 1%, the guide's "Measured"); on one rank nothing travels: the
    same run bit for bit."""
    packed, zero2 = four_ranks(f"{model}/{run}"), four_ranks(f"{model}/{plain}")
    for rank, result in enumerate(packed):
        assert not result.error and result.skipped == 0, f"{model}, {run}, rank {rank}: {result}"
        assert not any(result.diverging), f"{model}, {run}, rank {rank}"
    assert_ranks_agree(packed, f"{model}, {run}")
    if near is not None:
        assert packed[0].train_loss <= near * zero2[0].train_loss, (packed[0].train_loss, zero2[0].train_loss)
    assert packed[0].train_loss < 0.5 * packed[0].losses[0], (packed[0].train_loss, packed[0].losses[0])
    assert packed[0].bytes_sent * fewer < zero2[0].bytes_sent, (packed[0].bytes_sent, zero2[0].bytes_sent)
    local = one_rank(model, [run, plain])
    assert local[run].losses == local[plain].losses


# The flat form's loss limits against uncompressed ZeRO-2. Seeds 0, 1, 2 at
# 2 x 2: int4/int8 0.97x, 1.01x, 1.03x on the MLP (flat 0.96x, 1.01x, 1.01x),
# 1.03x, 1.03x, 1.18x on the CNN (flat 1.04x, 1.03x, 1.14x); sign/int8 1.31x,
# 1.22x, 1.32x on the MLP (flat 1.29x, 1.15x, 1.19x), 1.37x, 1.47x, 2.27x on
# the CNN (flat 1.46x, 1.30x, 1.59x): the sign codes of a node's sum lose
# more than those of each rank's gradient (docs/guides/multi-node.md
# "Convergence with the hierarchy").
@pytest.mark.parametrize("model,run,near", [
    *[(model, "zero2_int4_int8_2x2", 1.05) for model in ("digits", CNN)],
    *[(model, "zero2_sign_int8_2x2", near) for model, near in SIGN_LIMITS.items()]])
def test_node_aware_compressed_zero2_ends_near_zero2(model, run, near, four_ranks):
    """Node-aware compressed ZeRO-2 (4 ranks as 2 x 2, docs/design/node-aware-zero.md)
    on the digits MLP and CNN: no skipped step, the same parameters on
    every rank, a final training loss near uncompressed ZeRO-2's (the
    flat form's limit), and at most 0.55 of the flat form's bytes across
    nodes (the flat run of the same codecs, all of whose bytes but a third
    would cross nodes at 2 x 2)."""
    packed, zero2 = four_ranks(f"{model}/{run}"), four_ranks(f"{model}/zero2")
    flat = four_ranks(f"{model}/{run.removesuffix('_2x2')}")
    for rank, result in enumerate(packed):
        assert not result.error and result.skipped == 0, f"{model}, {run}, rank {rank}: {result}"
        assert not any(result.diverging), f"{model}, {run}, rank {rank}"
    assert_ranks_agree(packed, f"{model}, {run}")
    assert packed[0].train_loss <= near * zero2[0].train_loss, (packed[0].train_loss, zero2[0].train_loss)
    assert packed[0].train_loss < 0.5 * packed[0].losses[0], (packed[0].train_loss, packed[0].losses[0])
    assert 0 < packed[0].bytes_inter_node <= 0.55 * flat[0].bytes_sent * 2 / 3, \
        (packed[0].bytes_inter_node, flat[0].bytes_sent)


def test_lamb_without_bias_correction_is_one_bit_lambs_warmup():
    specs = [RunSpec("lamb", "digits", plain_lamb_config(bias_correction=False), steps=60, batch=64, seed=0),
             RunSpec("warmup", "digits", lamb_config(freeze_step=100000), steps=60, batch=64, seed=0)]
    local = training_runs.run_local(specs)
    assert local["lamb"].losses == local["warmup"].losses
