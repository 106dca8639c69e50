"""Run under ``mpirun -np P``: compressed ZeRO (docs/guides/compressed-zero.md)
against the numpy reference of compressed_zero_reference.py. Every check is
made on the ranks; a failing check aborts the run with its traceback.

The reference computes, for every reduction of a step, the decoded sums
each owner receives (each rank's residual included). An uncompressed run of
the same config and world size is then fed those sums as rank 0's
gradients and zeros elsewhere: its fp32 sums are the reference's exactly,
so the compressed run must take the same steps bit for bit. With a
parameter codec the compressed run's buffers must hold the reference codec
of the uncompressed run's fp32 masters (an fp32 parameter's own values, a
16-bit one's from every rank's blob), rounded to each parameter's dtype.
Phases
(``$DSOPT_TEST_PHASES``):

* reference: every scenario at stage 1 and 2, after every step: parameters
  and step infos as above, and every rank's buffers bit-identical;
* accumulation: gradients handed over one by one (``grad_ready``) over 2
  micro-batches at stage 1 and 2, against the reference per reduction;
* resume: saved after 3 steps, loaded into a fresh optimizer (residuals
  included), 3 more steps bit-identical to the uninterrupted run; a blob
  without residuals is refused;
* reshard: every rank's blobs loaded with load_state_dict_shards: masters
  and moments carry over, residuals start again at zero (the reference
  with zero residuals from there);
* memory: dsopt_memory_usage against the formula of the guide."""

import dataclasses
import struct
import warnings

import numpy as np
from mpi4py import MPI

import compressed_zero_reference as ref
import dsopt
from dsopt.plan.configs import Config, Settings
from dsopt.plan.memory import memory as planned_memory
from dsopt.plan.model import Model as PlanModel
from dsopt.plan.network import Topology
import zero_runs as zr
from mpi_phases import main
from test_blob_compat import pack, sections

MPI_WORLD = MPI.COMM_WORLD
warnings.simplefilter("ignore", dsopt.SkippedStepWarning)
SIZES = (37, 1000, 3, 513, 64)
FP32 = ("fp32",) * 5
MIXED = ("fp32", "bf16", "fp16", "fp32", "bf16")


def scenario(name, compression, kinds=FP32, sizes=SIZES, bucket=96, gather=200, **kw):
    kw.setdefault("grads", "random")
    return zr.Scenario(name, sizes=sizes, kinds=kinds, groups=(0, 1, 0, 1, 0)[:len(sizes)],
                       zero={"reduce_bucket_size": bucket, "allgather_bucket_size": gather,
                             "compression": compression}, **kw)


SCENARIOS = [
    scenario("int8", {"gradients": "int8", "gradient_block_size": 32, "parameter_block_size": 32}),
    scenario("int4_mixed", {"gradients": "int4", "gradient_block_size": 16, "parameter_block_size": 16}, kinds=MIXED),
    scenario("sign", {"gradients": "sign", "gradient_block_size": 8, "parameter_block_size": 8}),
    scenario("int4_no_feedback", {"gradients": "int4", "error_feedback": False}),
    scenario("int8_int8", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 32,
                           "parameter_block_size": 16}),
    scenario("int4_bf16", {"gradients": "int4", "parameters": "bf16"}, bucket=400, gather=50),
    scenario("params_only_int8", {"parameters": "int8", "gradient_block_size": 8, "parameter_block_size": 8}),
    scenario("one_bucket", {"gradients": "int4", "parameters": "int8"}, bucket=10**9, gather=10**9),
    # Three elements of padding at P = 4 with 2P-element buckets: rank 3's
    # piece of the last bucket is padding only.
    scenario("tiny", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 8, "parameter_block_size": 8},
             sizes=(1, 2, 3), kinds=("fp32",) * 3, bucket=1, gather=1),
    scenario("fp16_dynamic", {"gradients": "int4", "gradient_block_size": 64, "parameter_block_size": 64}, kinds=("fp16",) * 5,
             overflow=(3, 1),
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
    scenario("lamb", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 24,
                      "parameter_block_size": 40},
             sizes=zr.LAMB_SIZES, opt_type="Lamb", bucket=1000, gather=3000),
    scenario("lion", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 32,
                      "parameter_block_size": 16}, opt_type="Lion"),
    scenario("sgd", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 32,
                     "parameter_block_size": 16}, opt_type="SGD", top=zr.SGD_TOP),
    scenario("clipping", {"gradients": "int4", "parameters": "int8"}, top={"gradient_clipping": 0.5}),
    scenario("edge_int8", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 64, "parameter_block_size": 64}),
    scenario("edge_int4", {"gradients": "int4", "gradient_block_size": 8, "parameter_block_size": 8}),
    scenario("edge_nan", {"gradients": "sign", "parameters": "int8", "gradient_block_size": 64, "parameter_block_size": 64}),
    # 16-bit parameters with a parameter codec: each takes the decoded
    # master rounded to its dtype.
    scenario("bf16_bf16", {"gradients": "int8", "parameters": "bf16", "gradient_block_size": 32},
             kinds=("bf16",) * 5, top={"bf16": {"enabled": True}}),
    scenario("mixed_int8", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 16,
                            "parameter_block_size": 24}, kinds=MIXED, gather=150),
    scenario("mixed_bf16", {"parameters": "bf16"}, kinds=MIXED, gather=120),
    scenario("fp16_dynamic_int8", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 64,
                                   "parameter_block_size": 32}, kinds=("fp16",) * 5, overflow=(3, 1),
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
    scenario("lion_bf16", {"gradients": "int8", "parameters": "bf16", "gradient_block_size": 32},
             kinds=("bf16",) * 5, opt_type="Lion", top={"bf16": {"enabled": True}}),
    # The codecs' blocks spread over 3 threads of the kernels' pool (ranks
    # sharing cores would otherwise get 1 thread each).
    scenario("threads", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 8,
                         "parameter_block_size": 8}, bucket=400, gather=400, top={"threads": 3}),
]
BY_NAME = {sc.name: sc for sc in SCENARIOS}
RESUME = ["int8_int8", "int4_mixed", "fp16_dynamic", "lamb", "lion", "mixed_int8", "fp16_dynamic_int8",
          "lion_bf16", "sgd"]


def gradients(sc, step, rank, scale):
    """zero_runs' gradients, or for the "edge" scenarios values the codecs
    must survive: a block of zeros, denormals, magnitudes near FLT_MAX/8,
    tiny values beside large ones, and (edge_nan) a NaN on rank 0 at step 4
    that skips the step on every rank."""
    g = zr.gradients(sc, step, rank, scale)
    if not sc.name.startswith("edge"):
        return g
    rng = np.random.default_rng([sc.seed, step, rank, 99])
    big = g[1]
    big[0:64] = 0.0
    big[64:128] = (rng.standard_normal(64) * 1e-40).astype(np.float32)
    big[128:136] = (rng.standard_normal(8) * 4e37).astype(np.float32)
    big[136:200] = (rng.standard_normal(64) * 1e-30).astype(np.float32)
    big[200] = np.float32(1.0)
    if sc.name == "edge_nan" and step == 4 and rank == 0:
        g[3][5] = np.nan
    return g


def compression(sc):
    return sc.zero["compression"]


def plain(sc):
    """The same scenario without compression."""
    zero = {k: v for k, v in sc.zero.items() if k != "compression"}
    return dataclasses.replace(sc, zero=zero)


def make(sc, stage, comm, accumulation=1):
    params = zr.initial_params(sc)
    cfg = zr.config(sc, stage)
    if accumulation > 1:
        cfg["gradient_accumulation_steps"] = accumulation
    opt = dsopt.Optimizer(cfg, zr.as_dsopt(params, sc.kinds), comm=comm, groups=list(sc.groups))
    return opt


def ranks_per_node(sc, world):
    """R of a node-aware scenario ("topology": {"hierarchy": "node_aware",
    "ranks_per_node": R}) at this world size; 1 where the codes run flat."""
    t = sc.top.get("topology", {})
    per_node = t.get("ranks_per_node", 1)
    if t.get("hierarchy") != "node_aware" or world == 1 or world % per_node:
        return 1
    return per_node


def path(sc, world, residual=ref.int8_residual):
    c = compression(sc)
    if c.get("gradients", "none") == "none" or world == 1:
        return None  # nothing travels compressed: the twin gets the same gradients
    if ranks_per_node(sc, world) > 1:
        return ref.NodeAwarePath(sc.sizes, world, ranks_per_node(sc, world), sc.zero["reduce_bucket_size"],
                                 c["gradients"], c.get("gradient_block_size", 64),
                                 c.get("error_feedback", True), residual)
    return ref.GradientPath(sc.sizes, world, sc.zero["reduce_bucket_size"], c["gradients"],
                            c.get("gradient_block_size", 64), c.get("error_feedback", True), residual)


def reference_grads(sc, rp, world, k, scale, skip):
    """Rank 0's gradients of the uncompressed twin at step k: the decoded
    sums of every owner (zeros on the other ranks)."""
    per_rank = [gradients(sc, k, r, scale) for r in range(world)]
    if rp is None:
        return None
    return ref.split(rp.step(per_rank, commit=not skip, scale=scale), sc.sizes)


def twin_masters(sc, twin, world):
    """The uncompressed twin's fp32 masters (collective): an fp32
    parameter's own values; a 16-bit parameter's from every rank's blob,
    whose ``zero.masters`` holds the masters of the 16-bit elements of its
    shard in shard order. Each 16-bit buffer must be their rounding."""
    buckets, padded = ref.buckets(sc.sizes, world, sc.zero["reduce_bucket_size"])
    half = np.zeros(padded, bool)
    half[:sum(sc.sizes)] = np.concatenate([np.full(n, k != "fp32") for n, k in zip(sc.sizes, sc.kinds)])
    flat = np.zeros(padded, np.float32)
    flat[:sum(sc.sizes)] = np.concatenate([np.asarray(p, np.float32) if k == "fp32" else np.zeros(len(p), np.float32)
                                           for p, k in zip(zr.opt_params(twin), sc.kinds)])
    seen = ~half
    for r, data in enumerate(MPI_WORLD.allgather(dict(sections(twin.state_dict())[1])["zero.masters"])):
        index = ref.shard_index(world, buckets, r)
        index = index[half[index]]
        values = np.frombuffer(data, np.float32)
        assert len(values) == len(index), f"{sc.name}: rank {r} saved {len(values)} masters, not {len(index)}"
        flat[index] = values
        seen[index] = True
    assert seen.all(), f"{sc.name}: masters of {np.flatnonzero(~seen)[:8]} are nowhere"
    masters = ref.split(flat, sc.sizes)
    assert_bits(zr.opt_params(twin), [ref.as_kind(k, m) for k, m in zip(sc.kinds, masters)],
                f"{sc.name}: the twin's buffers and its masters")
    return masters


def expected_params(sc, twin, world):
    """The compressed run's buffers: the twin's masters through the
    parameter codec, rounded to each parameter's dtype (collective)."""
    c = compression(sc)
    codec = c.get("parameters", "none")
    if codec == "none" or world == 1:
        return zr.opt_params(twin)
    buckets, padded = ref.buckets(sc.sizes, world, sc.zero["reduce_bucket_size"])
    flat = np.zeros(padded, np.float32)
    flat[:sum(sc.sizes)] = np.concatenate(twin_masters(sc, twin, world))
    out = ref.gathered(flat, world, buckets, sc.zero["allgather_bucket_size"], codec,
                       c.get("parameter_block_size", 256))
    return [ref.as_kind(kind, x) for kind, x in zip(sc.kinds, ref.split(out, sc.sizes))]


def check_replicas(params, what):
    """Every rank's buffers hold the same bytes."""
    mine = b"".join(np.ascontiguousarray(p).tobytes() for p in params)
    everyone = MPI_WORLD.allgather(mine)
    assert all(x == everyone[0] for x in everyone), f"{what}: the ranks' parameters differ"


def assert_bits(actual, expected, what):
    for i, (a, e) in enumerate(zip(actual, expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.dtype == e.dtype and a.shape == e.shape, \
            f"{what}: tensor {i} is {a.dtype} {a.shape}, expected {e.dtype} {e.shape}"
        if a.tobytes() != e.tobytes():
            diff = np.flatnonzero(a.view(np.uint8).reshape(len(a), -1) != e.view(np.uint8).reshape(len(e), -1))
            diff = np.unique(diff // a.itemsize)
            raise AssertionError(f"{what}: tensor {i} differs at {diff[:8]} ({len(diff)} elements): "
                                 f"{a[diff[:4]]} vs {e[diff[:4]]}")


def expected_bytes(sc, world):
    """(bytes_sent, bytes_inter_node) of a step by the formulas of
    docs/design/node-aware-zero.md, on the scenario's declared nodes."""
    c = compression(sc)
    t = sc.top.get("topology", {})
    wire = 2 if all(k != "fp32" for k in sc.kinds) else 4
    return ref.step_bytes(sc.sizes, world, t.get("ranks_per_node", world), sc.zero["reduce_bucket_size"],
                          sc.zero["allgather_bucket_size"], c.get("gradients", "none"),
                          c.get("parameters", "none"), c.get("gradient_block_size", 64),
                          c.get("parameter_block_size", 256), wire, ranks_per_node(sc, world) > 1)


def compare_run(sc, stage, comm, rank, world, steps=6, accumulation=1, first=0, opt=None,
                twin=None, rp=None, check_bytes=False):
    """Steps the compressed run and its uncompressed twin side by side;
    returns (opt, twin, rp) for further steps. ``check_bytes``: from the
    fourth step on (the first three check for replicated gradients), every
    applied step's bytes are the formulas'."""
    if opt is None:  # creation already writes the decoded masters into every rank's buffers
        opt = make(sc, stage, comm, accumulation)
        twin = make(plain(sc), stage, comm, accumulation)
        assert_bits(zr.opt_params(opt), expected_params(sc, twin, world),
                    f"{sc.name} stage {stage}: parameters after creation")
    rp = rp if rp is not None else path(sc, world)
    for k in range(first, first + steps):
        scale = opt.loss_scale
        skip = (bool(sc.overflow) and sc.overflow[0] == k and sc.overflow[1] < world) or \
            (sc.name == "edge_nan" and k == 4)
        mine = []
        sums = []
        for m in range(accumulation):
            g = gradients(sc, k * accumulation + m, rank, scale)
            mine.append(g)
            sums.append(reference_grads(sc, rp, world, k * accumulation + m, scale, skip)
                        if stage == 2 or accumulation == 1 else None)
        if stage == 1 and accumulation > 1 and rp is not None:
            # Stage 1 adds the micro-batches locally (fp32) and reduces once.
            per_rank = []
            for r in range(world):
                acc = None
                for m in range(accumulation):
                    g = gradients(sc, k * accumulation + m, r, scale)
                    acc = g if acc is None else [(a + b).astype(np.float32) for a, b in zip(acc, g)]
                per_rank.append(acc)
            sums = [ref.split(rp.step(per_rank, commit=not skip, scale=scale), sc.sizes)] + \
                   [[np.zeros(n, np.float32) for n in sc.sizes]] * (accumulation - 1)
        twin_grads = []
        for m in range(accumulation):
            if sums[m] is None:
                twin_grads.append(mine[m])
            else:
                twin_grads.append(sums[m] if rank == 0 else [np.zeros(n, np.float32) for n in sc.sizes])
            if skip and rank == 0 and sums[m] is not None:
                twin_grads[m][-1][0] = np.inf  # the overflow the compressed run saw
        if accumulation == 1:
            info = opt.step(mine[0])
            twin_info = twin.step(twin_grads[0])
        else:
            # One optimizer at a time: their reductions share the communicator.
            for o, grads in ((opt, mine), (twin, twin_grads)):
                for m in range(accumulation):
                    for i in range(len(sc.sizes)):
                        o.grad_ready(i, grads[m][i])
                if o is opt:
                    info = o.step()
                else:
                    twin_info = o.step()
        what = f"{sc.name} stage {stage} step {k}"
        assert info.skipped == twin_info.skipped == skip, f"{what}: skipped {info.skipped} {twin_info.skipped}"
        assert info.loss_scale == twin_info.loss_scale, what
        got = zr.opt_params(opt)
        assert_bits(got, expected_params(sc, twin, world), what)
        check_replicas(got, what)
        if check_bytes and k >= 3 and not skip and accumulation == 1:
            want = expected_bytes(sc, world)
            assert (info.bytes_sent, info.bytes_inter_node) == want, \
                f"{what}: sent {info.bytes_sent}, {info.bytes_inter_node} across nodes; formula {want}"
    return opt, twin, rp


def restore_model(opt, source):
    """What a model checkpoint does before the optimizer state is loaded:
    the parameters take the saved run's values."""
    for mine, theirs in zip(zr.opt_params(opt), zr.opt_params(source)):
        mine[...] = theirs


def reference_phase(comm, rank, world):
    n = 0
    for sc in SCENARIOS:
        for stage in (1, 2):
            compare_run(sc, stage, comm, rank, world)
            n += 1
    if world > 1:
        # The comparison tells the residual's rounding apart: a reference
        # that keeps it in fp32 disagrees with dsopt.
        sc = BY_NAME["int8"]
        try:
            compare_run(sc, 2, comm, rank, world, rp=path(sc, world, residual=lambda block, lost: lost))
        except AssertionError:
            n += 1
        else:
            raise AssertionError("a reference with fp32 residuals agreed with dsopt")
    return n


def accumulation_phase(comm, rank, world):
    for name in ("int8", "int4_mixed", "int8_int8"):
        for stage in (1, 2):
            compare_run(BY_NAME[name], stage, comm, rank, world, steps=3, accumulation=2)
    return 6


def resume_phase(comm, rank, world):
    for name in RESUME:
        sc = BY_NAME[name]
        opt, twin, rp = compare_run(sc, 2, comm, rank, world, steps=3)
        blob = opt.state_dict()
        fresh = make(sc, 2, comm)
        restore_model(fresh, opt)
        fresh.load_state_dict(blob)
        assert_bits(zr.opt_params(fresh), zr.opt_params(opt), f"{name}: loaded parameters")
        compare_run(sc, 2, comm, rank, world, steps=3, first=3, opt=fresh, twin=twin, rp=rp)
        if world > 1 and compression(sc).get("gradients", "none") != "none":
            reject_damaged_residuals(fresh, rank)
            load_fp32_residual(fresh, sc, rank, world)
            # A blob without residuals (an uncompressed run's) is refused.
            other = make(sc, 2, comm)
            try:
                other.load_state_dict(make(plain(sc), 2, comm).state_dict())
            except dsopt.Mismatch as error:
                assert "load_state_dict_shards" in str(error) or "dsopt_state_load_shards" in str(error), str(error)
            else:
                raise AssertionError(f"{name}: a blob without residuals loaded")
    return len(RESUME)


def load_fp32_residual(opt, sc, rank, world):
    """A blob whose residual is n' fp32 values (no zero.feedback_int8
    section, as saved before the residual was int8) loads: the residual
    becomes their int8 encoding, piece by piece."""
    prefix, parts = sections(opt.state_dict())
    buckets, padded = ref.buckets(sc.sizes, world, sc.zero["reduce_bucket_size"])
    block = compression(sc).get("gradient_block_size", 64)
    values = (np.random.default_rng(rank).standard_normal(padded) * 1e-3).astype(np.float32)
    old = [(n, values.tobytes() if n == "zero.feedback" else d) for n, d in parts if n != "zero.feedback_int8"]
    opt.load_state_dict(pack(prefix, old))
    want = b"".join(ref.encode("int8", block, values[s + j * (n // world):s + (j + 1) * (n // world)])[0]
                    for s, n in buckets for j in range(world))
    saved = dict(sections(opt.state_dict())[1])
    assert saved["zero.feedback"] == want, f"rank {rank}: an fp32 residual loaded as {saved['zero.feedback'][:16]}"


def reject_damaged_residuals(opt, rank):
    """A blob whose residual sections are damaged (an impossible scale, a
    truncated or missing residual) is rejected on every rank and changes
    nothing: every rank damages its own blob the same way."""
    blob, params = opt.state_dict(), [p.copy() for p in zr.opt_params(opt)]
    prefix, parts = sections(blob)
    names = [n for n, _ in parts]
    assert {"zero.feedback", "zero.feedback_int8", "zero.feedback_scale"} <= set(names), names
    damaged = {
        "zero scale": [(n, struct.pack("<d", 0.0) if n == "zero.feedback_scale" else d) for n, d in parts],
        "NaN scale": [(n, struct.pack("<d", float("nan")) if n == "zero.feedback_scale" else d) for n, d in parts],
        "short residual": [(n, d[:-4] if n == "zero.feedback" else d) for n, d in parts],
        "no residual": [(n, d) for n, d in parts if n != "zero.feedback"],
        "fp32 residual, int8 length": [(n, d) for n, d in parts if n != "zero.feedback_int8"],
        "bad format flag": [(n, struct.pack("<i", 2) if n == "zero.feedback_int8" else d) for n, d in parts],
    }
    for what, changed in damaged.items():
        try:
            opt.load_state_dict(pack(prefix, changed))
        except (dsopt.CorruptState, dsopt.Mismatch):
            pass
        else:
            raise AssertionError(f"rank {rank}: a blob with a {what} loaded")
        assert opt.state_dict() == blob, f"rank {rank}: a rejected blob ({what}) changed the state"
        assert_bits(zr.opt_params(opt), params, f"{what}: parameters after a rejected load")


def reshard_phase(comm, rank, world):
    for name in RESUME:
        sc = BY_NAME[name]
        opt, twin, rp = compare_run(sc, 2, comm, rank, world, steps=3)
        blobs = MPI_WORLD.allgather(opt.state_dict())
        twin_blob = twin.state_dict()
        fresh, fresh_twin = make(sc, 2, comm), make(plain(sc), 2, comm)
        restore_model(fresh, opt)
        restore_model(fresh_twin, twin)
        fresh.load_state_dict_shards(blobs)
        fresh_twin.load_state_dict(twin_blob)
        assert_bits(zr.opt_params(fresh), zr.opt_params(opt), f"{name}: resharded parameters")
        restarted = path(sc, world)  # residuals start again at zero
        compare_run(sc, 2, comm, rank, world, steps=3, first=3, opt=fresh, twin=fresh_twin,
                    rp=restarted)
        if compression(sc).get("parameters", "none") != "none" and world > 1:
            # Into an uncompressed stage-0 run: fp32 parameters take the
            # saved masters (the twin's values), not the decoded ones.
            stage0 = make(plain(sc), 0, comm)
            stage0.load_state_dict_shards(blobs)
            assert_bits(zr.opt_params(stage0), zr.opt_params(twin), f"{name}: into stage 0")
            # From the uncompressed twin's blobs, the caller's parameters
            # restored first (a model checkpoint): masters come from them.
            back = make(sc, 2, comm)
            restore_model(back, twin)
            back.load_state_dict_shards(MPI_WORLD.allgather(twin_blob))
            assert_bits(zr.opt_params(back), expected_params(sc, twin, world),
                        f"{name}: from the uncompressed run")
    return len(RESUME)


def expected_memory(sc, world):
    """docs/guides/compressed-zero.md "Memory": uncompressed ZeRO-2's bytes
    (zero_runs.expected_host_bytes) with its one buffer resized, plus, at
    P > 1, a gradient codec's buffer of what is encoded aside and its
    residual and pending copy (twice the int8 runs of every bucket's P
    pieces), and fp32 masters of every element with a parameter codec (4 S,
    replacing the 16-bit ones). Pieces of m elements whose run bytes R(m)
    exceed 2 m are encoded aside (P R(m)) and received into the buffer; the
    others in the bucket's buffer, piece 0 aside (R(m)). The buffer holds
    a bucket (4 B) and an allgather chunk: every rank's parameters
    (w L (P + 1)), or with a parameter codec a decoded chunk and the encoded
    ones (4 L + (P + 1) C(L))."""
    base = zr.expected_host_bytes(sc, world)[2]
    if world == 1:
        return base
    c = compression(sc)
    buckets, padded = ref.buckets(sc.sizes, world, sc.zero["reduce_bucket_size"])
    shard = padded // world
    block = c.get("gradient_block_size", 64)
    pblock = c.get("parameter_block_size", 256)
    largest = max(n for _, n in buckets)
    p = c.get("parameters", "none")
    chunk = ref.chunk_length(shard, world, sc.zero["allgather_bucket_size"], p, pblock)
    plain_chunk = ref.chunk_length(shard, world, sc.zero["allgather_bucket_size"], "none", pblock)
    # MEMORY is all bf16 without padding: w = 2, every shard element already has a master.
    old_buffer = max(4 * largest, 2 * plain_chunk * (world + 1))
    buffer, extra = 4 * largest, 0
    g = c.get("gradients", "none")
    if g != "none":
        aside = max([world * ref.run_bytes(g, block, n // world) for _, n in buckets
                     if ref.run_bytes(g, block, n // world) > 2 * (n // world)], default=0)
        buffer = max(buffer, aside)
        extra += max(ref.run_bytes(g, block, largest // world), aside)
        if c.get("error_feedback", True):
            extra += 2 * sum(world * ref.run_bytes("int8", block, n // world) for _, n in buckets)
    if p == "none":
        buffer = max(buffer, 2 * chunk * (world + 1))
    else:
        coded = 2 * chunk if p == "bf16" else ref.run_bytes("int8", pblock, chunk)
        buffer = max(buffer, 4 * chunk + (world + 1) * coded)
    return base - old_buffer + buffer + extra


def memory_phase(comm, rank, world):
    checked = 0
    # The last: pieces of 12-24 elements in 64-element blocks, encoded aside.
    for comp, bucket in (({"gradients": "int4"}, 96), ({"gradients": "sign", "error_feedback": False}, 96),
                         ({"gradients": "int8", "parameters": "int8"}, 96), ({"parameters": "bf16"}, 96),
                         ({"gradients": "int8", "parameters": "bf16", "gradient_block_size": 64}, 48)):
        sc = dataclasses.replace(zr.MEMORY, zero={"reduce_bucket_size": bucket, "allgather_bucket_size": 200,
                                                  "compression": {"gradient_block_size": 32,
                                                                  "parameter_block_size": 16, **comp}})
        opt = make(sc, 2, comm)
        for k in range(2):
            opt.step(gradients(sc, k, rank, opt.loss_scale))
        got, want = opt.memory_usage()["host"], expected_memory(sc, world)
        assert got == want, f"{comp} at P={world}: memory_usage {got}, formula {want}"
        checked += 1
    return checked


def bucket_phase(comm, rank, world):
    """The int8 parameter codec decodes the same values at any
    allgather_bucket_size (its chunks are whole blocks, so its blocks start
    at the same shard offsets): the parameters of runs that differ only in
    it are bit-identical (stage 1 and 2)."""
    checked = 0
    for stage in (1, 2):
        runs = []
        for gather in (40, 77, 200, 10**9):
            sc = scenario(f"int8 gather {gather}", {"gradients": "int8", "parameters": "int8",
                                                    "gradient_block_size": 32,
                                                    "parameter_block_size": 16}, gather=gather)
            opt = make(sc, stage, comm)
            for k in range(4):
                opt.step(gradients(sc, k, rank, opt.loss_scale))
            runs.append([p.copy() for p in zr.opt_params(opt)])
        for gather, params in zip((77, 200, 10**9), runs[1:]):
            assert_bits(params, runs[0], f"stage {stage}: allgather_bucket_size {gather} against 40")
            checked += 1
    return checked


# ---- node-aware (docs/design/node-aware-zero.md) -----------------------------

def node_aware(sc, per_node=2, hierarchy="node_aware"):
    """The scenario on nodes of ``per_node`` ranks with the hierarchy."""
    top = dict(sc.top, topology={"hierarchy": hierarchy, "ranks_per_node": per_node})
    return dataclasses.replace(sc, name=f"{sc.name} {hierarchy} R={per_node}", top=top)


NODE_AWARE = [
    scenario("int4_int8", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 16,
                           "parameter_block_size": 16}),
    scenario("sign_int8", {"gradients": "sign", "parameters": "int8", "gradient_block_size": 8,
                           "parameter_block_size": 32}),
    scenario("int8_int8_mixed", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 32,
                                 "parameter_block_size": 24}, kinds=MIXED, gather=150),
    scenario("int4_bf16_bf16", {"gradients": "int4", "parameters": "bf16", "gradient_block_size": 32},
             kinds=("bf16",) * 5, top={"bf16": {"enabled": True}}),
    scenario("fp16_dynamic_int8", {"gradients": "int4", "parameters": "int8", "gradient_block_size": 64,
                                   "parameter_block_size": 32}, kinds=("fp16",) * 5, overflow=(3, 1),
             top={"fp16": {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 2}}),
    scenario("one_bucket", {"gradients": "int4", "parameters": "int8"}, bucket=10**9, gather=10**9),
    scenario("tiny", {"gradients": "int8", "parameters": "int8", "gradient_block_size": 8,
                      "parameter_block_size": 8}, sizes=(1, 2, 3), kinds=("fp32",) * 3, bucket=1, gather=1),
    scenario("int4_no_feedback", {"gradients": "int4", "error_feedback": False}),
    scenario("params_only_int8", {"parameters": "int8", "parameter_block_size": 8}),
]
NA_BY_NAME = {sc.name: sc for sc in NODE_AWARE}


def load_reports(opt, blob, want_reset, what):
    reset = opt.load_state_dict(blob)
    assert reset == want_reset, f"{what}: load_state_dict reported reset={reset}"


def node_aware_phase(comm, rank, world):
    """At P = N x 2: every node-aware scenario at stage 1 and 2 against
    the node-aware reference, bit for bit, every rank's buffers identical,
    bytes as the formulas; the same scenarios with "flat" on the same
    nodes against the flat reference (and its bytes); R = 1 is the flat
    form; gradients handed over one by one; deferred allgather; resume
    under the same topology bit for bit; a blob loaded under another
    topology resets the residual and says so; resharding restarts it."""
    n = 0
    for sc in NODE_AWARE:
        for stage in (1, 2):
            compare_run(node_aware(sc), stage, comm, rank, world, check_bytes=True)
            n += 1
        compare_run(node_aware(sc, hierarchy="flat"), 2, comm, rank, world, check_bytes=True)
        n += 1
    # R = 1: exactly the flat form (its reference and bytes).
    compare_run(node_aware(NA_BY_NAME["int4_int8"], per_node=1), 2, comm, rank, world, check_bytes=True)
    # Gradients handed over one by one over 2 micro-batches.
    for stage in (1, 2):
        compare_run(node_aware(NA_BY_NAME["int8_int8_mixed"]), stage, comm, rank, world, steps=3,
                    accumulation=2)
    n += 3
    n += deferred_node_aware(comm, rank, world)
    n += resume_node_aware(comm, rank, world)
    n += memory_node_aware(comm, rank, world)
    return n


def planned_node_aware_memory(sc, world, rank):
    """The planner's memory per rank of a node-aware scenario at stage 2
    (``dsopt.plan.memory`` with the topology: docs/design/node-aware-zero.md
    "Memory"), of the all-bf16 MEMORY model."""
    c = compression(sc)
    settings = Settings(reduce_bucket_size=sc.zero["reduce_bucket_size"],
                        allgather_bucket_size=sc.zero["allgather_bucket_size"],
                        gradient_block_size=c.get("gradient_block_size", 64),
                        parameter_block_size=c.get("parameter_block_size", 256),
                        error_feedback=c.get("error_feedback", True))
    cfg = Config(sc.opt_type, c.get("gradients", "none"), c.get("parameters", "none"), path="czero")
    per_node = ranks_per_node(sc, world)
    topo = Topology(world // per_node, per_node, True)
    return planned_memory(cfg, PlanModel(tuple(sc.sizes), "bf16"), world, settings, rank=rank, topo=topo)


def memory_node_aware(comm, rank, world):
    """memory_usage() and state_memory_usage() against the planner's, at
    several codecs and buckets."""
    checked = 0
    assert set(zr.MEMORY.kinds) == {"bf16"}
    for comp, bucket in (({"gradients": "int4"}, 96), ({"gradients": "int8", "parameters": "int8"}, 96),
                         ({"gradients": "sign", "error_feedback": False, "parameters": "bf16"}, 96),
                         ({"gradients": "int8", "parameters": "bf16", "gradient_block_size": 64}, 48)):
        sc = node_aware(dataclasses.replace(zr.MEMORY, zero={
            "reduce_bucket_size": bucket, "allgather_bucket_size": 200,
            "compression": {"gradient_block_size": 32, "parameter_block_size": 16, **comp}}))
        opt = make(sc, 2, comm)
        for k in range(2):
            opt.step(gradients(sc, k, rank, opt.loss_scale))
        got = opt.memory_usage()["host"], opt.state_memory_usage()["host"]
        want = planned_node_aware_memory(sc, world, rank)
        assert got == (want.total, want.state), \
            f"{comp} at P={world} node-aware: memory_usage, state {got}, planner {want}"
        checked += 1
    return checked


def deferred_node_aware(comm, rank, world):
    """The deferred allgather of the node-aware codes: the same parameters
    and bytes as gathering at once."""
    sc = node_aware(NA_BY_NAME["int4_int8"])
    deferred = dataclasses.replace(sc, zero=dict(sc.zero, deferred_allgather=True))
    a = make(sc, 2, comm)
    other = dsopt.Communicator.from_mpi4py(MPI_WORLD.Dup())
    b = make(deferred, 2, other)
    assert b.gather_buckets > 1
    for k in range(4):
        ia = a.step(gradients(sc, k, rank, 1.0))
        ib = b.step(gradients(sc, k, rank, 1.0))
        assert (ia.bytes_sent, ia.bytes_inter_node) == (ib.bytes_sent, ib.bytes_inter_node), (k, ia, ib)
        for i in reversed(range(len(sc.sizes))):
            b.wait_gather(i)
        assert_bits(zr.opt_params(b), zr.opt_params(a), f"deferred step {k}")
    b.close()
    other.close()
    return 1


def resume_node_aware(comm, rank, world):
    checked = 0
    for name in ("int4_int8", "int8_int8_mixed", "fp16_dynamic_int8"):
        sc = node_aware(NA_BY_NAME[name])
        opt, twin, rp = compare_run(sc, 2, comm, rank, world, steps=3)
        blob = opt.state_dict()
        saved = dict(sections(blob)[1])
        assert struct.unpack("<II", saved["zero.feedback_topology"]) == (world // 2, 2)
        fresh = make(sc, 2, comm)
        restore_model(fresh, opt)
        load_reports(fresh, blob, False, f"{name}: the same topology")
        compare_run(sc, 2, comm, rank, world, steps=3, first=3, opt=fresh, twin=twin, rp=rp)
        checked += 1
    # Under another topology at the same world size the residual starts
    # again at zero, and the load says so; both ways.
    sc = node_aware(NA_BY_NAME["int4_int8"])
    flat = node_aware(NA_BY_NAME["int4_int8"], hierarchy="flat")
    for src, dst in ((sc, flat), (flat, sc)):
        opt, twin, rp = compare_run(src, 2, comm, rank, world, steps=3)
        blobs = MPI_WORLD.allgather(opt.state_dict())
        twin_saved = make(plain(src), 2, comm)  # the twin at step 3, for the reshard below
        restore_model(twin_saved, twin)
        twin_saved.load_state_dict(twin.state_dict())
        fresh = make(dst, 2, comm)
        restore_model(fresh, opt)
        load_reports(fresh, blobs[rank], True, f"{src.name} into {dst.name}")
        compare_run(dst, 2, comm, rank, world, steps=3, first=3, opt=fresh, twin=twin, rp=path(dst, world))
        # Resharding (every rank's blobs) restarts it too.
        again = make(src, 2, comm)
        restore_model(again, opt)
        again.load_state_dict_shards(blobs)
        twin_again = twin_saved
        compare_run(src, 2, comm, rank, world, steps=2, first=3, opt=again, twin=twin_again,
                    rp=path(src, world))
        checked += 2
    return checked


if __name__ == "__main__":
    raise SystemExit(main({"reference": reference_phase, "accumulation": accumulation_phase,
                           "resume": resume_phase, "reshard": reshard_phase,
                           "memory": memory_phase, "bucket": bucket_phase,
                           "node_aware": node_aware_phase}))
