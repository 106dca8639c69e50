"""1-bit LAMB runs shared by the multi-rank script (mpi_lamb.py) and
test_onebit_lamb.py: scenarios in the shape of onebit_runs.Scenario (whose
data, driving and blob helpers are reused), the reference of a scenario,
and the reference's view of a blob's state."""

import copy
import dataclasses
import struct

import numpy as np

import onebit_runs as runs
from onebit_lamb_reference import OneBitLambReference
from onebit_runs import Scenario, with_top


def lamb_config(freeze_step=4, lr=1e-2, **params):
    p = {"lr": lr, "freeze_step": freeze_step}
    p.update(params)
    return {"optimizer": {"type": "OneBitLamb", "params": p}, "threads": 1}


def deepspeed_config(**kw):
    return lamb_config(stabilize=False, **kw)


SIZES = runs.SIZES
SCENARIOS = [
    Scenario("plain", deepspeed_config(), SIZES, steps=10),
    Scenario("weight_decay", with_top(deepspeed_config(weight_decay=0.01, betas=[0.8, 0.99], max_coeff=0.5),
                                      param_groups=[{}, {"lr": 3e-3, "weight_decay": 0.1}]),
             SIZES, groups=[0, 1, 0, 1, 1], steps=10, seed=2),
    Scenario("mask", deepspeed_config(weight_decay=0.01), SIZES, masks={0: "thirds", 3: "half"}, steps=10, seed=3),
    Scenario("fp16", deepspeed_config(weight_decay=0.01), SIZES, kinds=["fp16", "fp16", "fp32", "fp16", "fp32"],
             steps=10, seed=5),
    Scenario("bf16", deepspeed_config(), SIZES, kinds=["bf16"] * 5, steps=10, seed=6),
    Scenario("clipping", with_top(deepspeed_config(), gradient_clipping=2.0), SIZES, steps=10, seed=7),
    Scenario("freeze_step_1", deepspeed_config(freeze_step=1), SIZES, steps=4, seed=8),
    Scenario("skip", deepspeed_config(), SIZES, steps=10, seed=10, poison={1: 1, 5: 0, 6: 1}),
    Scenario("loss_scale", with_top(deepspeed_config(), fp16={"enabled": True, "loss_scale": 1024},
                                    gradient_clipping=5.0),
             SIZES, kinds=["fp16", "fp32", "fp16", "fp16", "fp32"], steps=10, seed=11),
    Scenario("factor_clamps", deepspeed_config(factor_max=1.05, factor_min=0.98, factor_threshold=0.01,
                                               coeff_beta=0.5, min_coeff=0.2),
             SIZES, steps=10, seed=12),
]


def stabilized(sc: Scenario, seed: int) -> Scenario:
    """The scenario on the default (stabilized) rule with its own data and
    parameter 0's first elements without gradient in warmup."""
    config = copy.deepcopy(sc.config)
    del config["optimizer"]["params"]["stabilize"]
    return dataclasses.replace(sc, name="stable_" + sc.name, config=config, seed=seed, cold={0: runs.COLD})


SCENARIOS += [stabilized(sc, 20 + sc.seed) for sc in SCENARIOS
              if sc.name in ("plain", "weight_decay", "mask", "fp16", "bf16", "clipping")]
# The default limit (4) rarely binds on these short runs; a tight one does.
_tight = stabilized(next(sc for sc in SCENARIOS if sc.name == "plain"), 40)
_tight.config["optimizer"]["params"]["stabilize_limit"] = 0.5
SCENARIOS.append(dataclasses.replace(_tight, name="stable_tight_limit"))
RESUME = ("stable_weight_decay", "weight_decay", "mask")
SAVE_AFTER = (2, 3, 6)  # warmup, the transition (next update compressed), compression
BY_NAME = {s.name: s for s in SCENARIOS}


def reference_for(sc: Scenario, world: int) -> OneBitLambReference:
    ref = OneBitLambReference(sc.config, runs.initial_params(sc), world, group_of=sc.groups, kinds=sc.kinds,
                              loss_scale=runs.loss_scale_of(sc))
    for i, kind in sc.masks.items():
        ref.set_mask(i, runs.make_mask(kind, sc.sizes[i]))
    return ref


def run_reference(sc: Scenario, world: int, steps=None, ref=None, start=0):
    ref = ref or reference_for(sc, world)
    infos = [ref.step([runs.grads_for(sc, k, r, world) for r in range(world)])
             for k in range(start, sc.steps if steps is None else steps)]
    return ref, infos


def blob_state(blob: runs.Blob):
    """A 1-bit LAMB blob's sections as arrays: m, v, vf, (lamb_coeff_freeze,
    last_factor, scaling_coeff) per tensor, tail, worker and server error,
    and the stage (compressing, freeze_step, frozen_after, error world)."""
    coeffs = np.frombuffer(blob.sections["lamb.coefficients"], np.float64).reshape(-1, 3)
    return dict(m=blob.floats("lamb.exp_avg"), v=blob.floats("lamb.exp_avg_sq"),
                vf=blob.floats("lamb.exp_avg_sq_fresh"), coeffs=coeffs,
                tail=blob.floats("lamb.momentum_tail"), ew=blob.floats("lamb.worker_error"),
                es=blob.floats("lamb.server_error"), stage=struct.unpack("<iqqi", blob.sections["lamb.stage"]))


def reference_blob_state(ref: OneBitLambReference, rank: int):
    has_car = ref.car is not None
    empty = np.zeros(0, np.float32)
    return dict(m=np.concatenate(ref.m), v=np.concatenate(ref.v), vf=np.concatenate(ref.vf),
                coeffs=np.array([ref.coeff_freeze, ref.last_factor, ref.scaling], np.float64).T,
                tail=ref.tail if has_car else empty, ew=ref.car.ew[rank] if has_car else empty,
                es=ref.car.es[rank] if has_car else empty,
                stage=(int(ref.compression), ref.freeze_step, ref.frozen_after, ref.world if has_car else 0))
