"""dsopt.canonical_config and dsopt.Optimizer.config: the canonical JSON of
every optimizer type equals the defaults written out here by hand (from
docs/reference/config.md); aliases resolve; an optimizer created from the
canonical config has the same config; bad configs raise and change
nothing."""

import copy

import numpy as np
import pytest

import dsopt

HYPER = {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.0}
COMMON = {
    "device": "cpu", "threads": 0, "cuda_aware": False, "comm_timeout": 0.0,
    "gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "skip_nonfinite": True,
    "report_grad_norm": False, "max_consecutive_skips": 50,
    "bf16": {"enabled": False},
    "fp16": {"enabled": False, "loss_scale": 0.0, "initial_scale_power": 16,
             "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": False,
             "min_loss_scale": 1.0},
    "zero_optimization": {"stage": 0, "reduce_bucket_size": 500000000,
                          "allgather_bucket_size": 500000000, "reduce_scatter": True,
                          "deferred_allgather": False,
                          "offload_optimizer": {"device": "none", "pin_memory": False},
                          "compression": {"gradients": "none", "parameters": "none",
                                          "error_feedback": True, "gradient_block_size": 64,
                                          "parameter_block_size": 256}},
    "divergence_check": {"enabled": True, "factor": 20.0, "min_steps": 10, "horizon": 50,
                         "count": 3, "window": 8},
    "topology": {"hierarchy": "auto", "ranks_per_node": 0, "node_reduce": "fp32"},
}
ONEBIT = {"freeze_step": 100000, "stabilize": True, "stabilize_limit": 4.0}
PARAMS = {
    "Adam": dict(HYPER, bias_correction=True, adam_w_mode=True),
    "AdamW": dict(HYPER, bias_correction=True, adam_w_mode=True),
    "Lamb": dict(HYPER, bias_correction=True, max_coeff=10.0, min_coeff=0.01),
    "OneBitAdam": dict(HYPER, bias_correction=True, **ONEBIT),
    "OneBitLamb": dict(HYPER, **ONEBIT, max_coeff=10.0, min_coeff=0.01, coeff_beta=0.9,
                       factor_max=4.0, factor_min=0.5, factor_threshold=0.1),
    "ZeroOneAdam": dict(HYPER, bias_correction=True, stabilize=True, stabilize_limit=4.0,
                        var_freeze_step=100000, var_update_scaler=16, local_step_scaler=32678,
                        local_step_clipper=16, decoupled_sync_weight_decay=False),
}


def expected(kind):
    group = dict(HYPER, non_freeze=False) if kind == "OneBitAdam" else dict(HYPER)
    return dict(copy.deepcopy(COMMON), optimizer={"type": kind, "params": PARAMS[kind]},
                param_groups=[group])


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_defaults_of_every_type(kind):
    assert dsopt.canonical_config({"optimizer": {"type": kind}}) == expected(kind)


def test_aliases_resolve():
    config = {"optimizer": {"type": "ADAMW", "params": {"cuda_aware": False,
                                                        "comm_backend_name": "nccl"}},
              "train_batch_size": 8}
    assert dsopt.canonical_config(config) == expected("AdamW")
    adam_l2 = dsopt.canonical_config(
        '{"optimizer": {"type": "adam", "params": {"adam_w_mode": false}}}')
    assert adam_l2["optimizer"] == {"type": "Adam", "params": dict(PARAMS["Adam"], adam_w_mode=False)}


def test_optimizer_config_round_trips_and_shows_run_time_values(rng):
    config = {"optimizer": {"type": "ZeroOneAdam", "params": {"lr": 0.01}},
              "param_groups": [{"weight_decay": 0.1}, {"betas": [0.8, 0.9]}],
              "gradient_clipping": 2.0}
    canonical = dsopt.canonical_config(config)
    params = [rng.standard_normal(4).astype(np.float32) for _ in range(2)]
    with dsopt.Optimizer(config, params, groups=[0, 1]) as opt:
        assert opt.config == canonical
        with dsopt.Optimizer(canonical, [p.copy() for p in params], groups=[0, 1]) as again:
            assert again.config == canonical
        opt.set_group_param(1, "lr", 0.5)
        opt.gradient_clipping = 1.0
        now = opt.config
    assert now["param_groups"][1]["lr"] == 0.5
    assert now["gradient_clipping"] == 1.0
    assert now["optimizer"] == canonical["optimizer"]


def test_bad_configs_raise():
    with pytest.raises(dsopt.InvalidArgument, match="Adagrad"):
        dsopt.canonical_config({"optimizer": {"type": "Adagrad"}})
    with pytest.raises(dsopt.InvalidArgument, match="lr"):
        dsopt.canonical_config({"optimizer": {"type": "Adam", "params": {"lr": -1}}})
    with pytest.raises(dsopt.Unsupported):
        dsopt.canonical_config({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}})


def test_node_reduce_is_the_one_bit_familys():
    """topology.node_reduce: "fp32" (default) or "1bit", the latter only
    for the algorithms of the 1-bit allreduce."""
    for kind in ("OneBitAdam", "OneBitLamb", "ZeroOneAdam"):
        c = dsopt.canonical_config({"optimizer": {"type": kind}, "topology": {"node_reduce": "1bit"}})
        assert c["topology"]["node_reduce"] == "1bit"
    assert dsopt.canonical_config({"optimizer": {"type": "OneBitAdam"}})["topology"]["node_reduce"] == "fp32"
    with pytest.raises(dsopt.InvalidArgument, match="node_reduce.*\"fp32\" or \"1bit\""):
        dsopt.canonical_config({"optimizer": {"type": "OneBitAdam"}, "topology": {"node_reduce": "int8"}})
    for kind in ("AdamW", "Lamb"):
        with pytest.raises(dsopt.InvalidArgument, match="node_reduce.*1-bit allreduce.*OneBitAdam"):
            dsopt.canonical_config({"optimizer": {"type": kind}, "topology": {"node_reduce": "1bit"}})
    with pytest.raises(dsopt.InvalidArgument, match="node_reduce"):
        dsopt.canonical_config({"optimizer": {"type": "AdamW"}, "topology": {"node_reduce": "1bit"},
                                "zero_optimization": {"stage": 2, "compression": {"gradients": "int4"}}})
