"""0/1 Adam runs shared by the multi-rank script (mpi_zoadam.py) and the
tests (test_zero_one_adam.py): scenarios with short schedules that reach
every kind of step (full, 1-bit, local, sync) in 20 updates, their data, and
helpers that drive a dsopt.Optimizer and the reference. Scenario, blobs,
masks and initial parameters are onebit_runs'."""

import struct

import numpy as np

import dsopt
import onebit_runs as ob
from onebit_runs import Scenario, as_dsopt_params, initial_params, loss_scale_of, make_mask, with_top
from onebit_reference import padded_length
from zoadam_reference import ZeroOneAdamReference

# Updates 1-8 (k = 2..9): full at k = 2, 3, 4, 6, 8, 1-bit at 5, 7, 9; then
# phase 2 with syncs at k = 10, 11, 12, 16, 20, local steps between.
SCHEDULE = dict(var_freeze_step=8, var_update_scaler=2, local_step_scaler=2, local_step_clipper=4)
SIZES = [1000, 7, 33, 4097, 64]
STEPS = 20


def zoadam_config(lr=1e-2, **params):
    p = dict(SCHEDULE, lr=lr)
    p.update(params)
    return {"optimizer": {"type": "ZeroOneAdam", "params": p}, "threads": 1}


def deepspeed_config(**kw):
    """DeepSpeed's rule ("stabilize": false, "bias_correction": false)."""
    return zoadam_config(stabilize=False, bias_correction=False, **kw)


TWO_GROUPS = [{}, {"lr": 3e-3, "weight_decay": 0.1}]

SCENARIOS = [
    Scenario("plain", deepspeed_config(), SIZES, steps=STEPS, seed=1),
    Scenario("weight_decay", with_top(deepspeed_config(weight_decay=0.01, betas=[0.8, 0.99]),
                                      param_groups=TWO_GROUPS), SIZES, groups=[0, 1, 0, 1, 1], steps=STEPS, seed=2),
    Scenario("decoupled_wd", with_top(deepspeed_config(weight_decay=0.01, decoupled_sync_weight_decay=True),
                                      param_groups=TWO_GROUPS), SIZES, groups=[0, 1, 1, 0, 1], steps=STEPS, seed=3),
    Scenario("mask", deepspeed_config(weight_decay=0.01), SIZES, masks={0: "thirds", 3: "half"}, steps=STEPS, seed=4),
    Scenario("fp16", with_top(deepspeed_config(weight_decay=0.01), fp16={"enabled": True, "loss_scale": 1024}),
             SIZES, kinds=["fp16", "fp16", "fp32", "fp16", "fp32"], steps=STEPS, seed=5),
    Scenario("bf16", deepspeed_config(), SIZES, kinds=["bf16"] * 5, steps=STEPS, seed=6),
    Scenario("clipping", with_top(deepspeed_config(), gradient_clipping=2.0), SIZES, steps=STEPS, seed=7),
    # a NaN/Inf on one rank on a full, a 1-bit, a sync and a local step
    Scenario("skip", deepspeed_config(), SIZES, steps=STEPS, seed=8, poison={2: 1, 4: 0, 9: 1, 13: 0}),
    Scenario("stable_plain", zoadam_config(), SIZES, steps=STEPS, seed=9, cold={0: 40}),
    Scenario("stable_weight_decay", with_top(zoadam_config(weight_decay=0.01), param_groups=TWO_GROUPS,
                                             gradient_clipping=3.0),
             SIZES, groups=[0, 1, 0, 1, 1], steps=STEPS, seed=10, cold={0: 40, 3: 100}),
    # the default limit (4) rarely binds on these short runs; a tight one does
    Scenario("stable_tight_limit", zoadam_config(stabilize_limit=0.5), SIZES, steps=STEPS, seed=11, cold={0: 40}),
    # bias correction with the accumulator's lr weights, and without the clamp
    Scenario("stable_decoupled_wd", with_top(zoadam_config(weight_decay=0.01, decoupled_sync_weight_decay=True),
                                             param_groups=TWO_GROUPS),
             SIZES, groups=[0, 1, 1, 0, 1], steps=STEPS, seed=12, cold={0: 40}),
    Scenario("bias_corrected", zoadam_config(stabilize=False, weight_decay=0.01), SIZES, steps=STEPS, seed=13),
]
BY_NAME = {s.name: s for s in SCENARIOS}
# Saved after 2 (phase 1), 5 (phase 1, interval 2), 8 (the phase change just
# happened) and 13 updates (phase 2, mid-interval: the accumulator is not zero).
RESUME = ("weight_decay", "stable_weight_decay", "decoupled_wd", "fp16", "mask")
SAVE_AFTER = (2, 5, 8, 13)


def grads_for(sc, step, rank, world=1):
    """This rank's gradients of a step (times the static loss scale); zero
    on the cold elements before var_freeze_step; a NaN/Inf where poisoned."""
    return ob.grads_for(sc, step, rank, world, salt=(7,),
                        warmup=lambda s: s.config["optimizer"]["params"]["var_freeze_step"])


def reference_for(sc, world):
    ref = ZeroOneAdamReference(sc.config, initial_params(sc), world, group_of=sc.groups, kinds=sc.kinds,
                               loss_scale=loss_scale_of(sc))
    for i, kind in sc.masks.items():
        ref.set_mask(i, make_mask(kind, sc.sizes[i]))
    return ref


def run_reference(sc, world, ref=None, start=0):
    ref = ref or reference_for(sc, world)
    infos = [ref.step([grads_for(sc, k, r, world) for r in range(world)]) for k in range(start, sc.steps)]
    return ref, infos


def run_dsopt(sc, comm, rank, world, save_after=()):
    params = initial_params(sc)
    saved, infos = {}, []
    with dsopt.Optimizer(sc.config, as_dsopt_params(params, sc.kinds), comm=comm, groups=sc.groups) as opt:
        for i, kind in sc.masks.items():
            opt.set_momentum_mask(i, make_mask(kind, sc.sizes[i]))
        for k in range(sc.steps):
            infos.append(opt.step(grads_for(sc, k, rank, world)))
            if k + 1 in save_after:
                saved[k + 1] = (opt.state_dict(), [p.copy() for p in params])
        blob = opt.state_dict()
    return params, infos, blob, saved


def resume_run(sc, comm, rank, blob, params_at_save, start, world=1):
    params = [p.copy() if k == "fp32" else np.zeros_like(p) for p, k in zip(params_at_save, sc.kinds)]
    infos = []
    with dsopt.Optimizer(sc.config, as_dsopt_params(params, sc.kinds), comm=comm, groups=sc.groups) as opt:
        for i, kind in sc.masks.items():
            opt.set_momentum_mask(i, make_mask(kind, sc.sizes[i]))
        opt.load_state_dict(blob)
        for k in range(start, sc.steps):
            infos.append(opt.step(grads_for(sc, k, rank, world)))
        final = opt.state_dict()
    return params, infos, final


def info_rows(infos):
    return np.array([[i.skipped, i.compressed, i.step, i.bytes_sent, i.grad_norm, i.phase] for i in infos],
                    dtype=np.float64).reshape(-1, 6)


def save_npz(path, params, infos, **blobs):
    arrays = {f"p{i}": p for i, p in enumerate(params)}
    arrays["infos"] = info_rows(infos)
    for name, b in blobs.items():
        arrays[name] = np.frombuffer(b, np.uint8)
    np.savez(path, **arrays)


load_npz = ob.load_npz
parse_blob = ob.parse_blob


def schedule_of(blob):
    """(frozen, var_interval, var_counter, local_interval, local_counter,
    variance_updates, world of the errors) of a ZeroOneAdam blob."""
    return struct.unpack("<iqqqqqi", blob.sections["zoadam.schedule"])


def reference_state(ref, rank):
    """Blob contents the reference predicts for `rank`."""
    cat = np.concatenate
    out = dict(m=cat(ref.m[rank]), v=cat(ref.v))
    if ref.frozen:
        out["acc"] = cat(ref.acc[rank])
        out["anchor"] = cat(ref.anchor)
    if ref.cars is not None:
        out["ew"] = cat([c.ew[rank] for c in ref.cars])
        out["es"] = cat([c.es[rank] for c in ref.cars])
    return out


def step_bytes(sc, world, info):
    """Bytes of one step: the 16-byte handshake allreduce that starts every
    collective call (while fewer than 3 updates were applied another one
    compares the gradients' hashes), then full steps the fp32 gradient
    allreduce with the status float; every other step the 16-byte control
    allreduce (status, norm), plus the CAR of every tensor on 1-bit steps and
    syncs."""
    P = world
    if P == 1:
        return 0
    n = sum(sc.sizes)
    applied_before = info["step"] - (0 if info["skipped"] else 1)
    handshake = 2 * (P - 1) * 16 // P * (2 if applied_before < 3 else 1)
    if info["would_be_full"]:
        return handshake + 2 * (P - 1) * 4 * (n + 1) // P
    total = handshake + 2 * (P - 1) * 16 // P
    if info["phase"] in (2, 4):
        padded = sum(padded_length(x, P) for x in sc.sizes)
        total += (P - 1) * padded // (4 * P) + 8 * (P - 1) * len(sc.sizes)
    return total
