"""dsopt.Optimizer's calls for absent gradients (None in step), group
hyperparameters by name, state views and per-parameter step counts (the
numpy API; dsopt.torch builds on them: test_torch_drop_in.py)."""

import gc
import weakref

import numpy as np
import pytest

import dsopt

ADAM = {"optimizer": {"type": "Adam", "params": {"lr": 0.1, "adam_w_mode": False}}}


def params(*sizes):
    return [np.linspace(-1, 1, n, dtype=np.float32) for n in sizes]


def test_group_params_by_name():
    with dsopt.Optimizer(ADAM, params(3, 4), groups=[{}, {"lr": 0.2, "eps": 1e-6}]) as opt:
        assert [opt.get_group_param(1, n) for n in dsopt.Optimizer.GROUP_PARAMS] == \
            [0.2, 0.9, 0.999, 1e-6, 0.0]
        opt.set_group_param(0, "beta1", 0.5)
        opt.set_group_param(0, "weight_decay", 0.01)
        assert opt.get_group_param(0, "beta1") == 0.5
        assert opt.get_group_param(0, "weight_decay") == 0.01
        assert opt.get_group_param(1, "beta1") == 0.9
        with pytest.raises(dsopt.InvalidArgument, match="momentum"):
            opt.get_group_param(0, "momentum")
        with pytest.raises(dsopt.InvalidArgument):
            opt.set_group_param(0, "beta2", 1.0)
        with pytest.raises(dsopt.InvalidArgument):
            opt.set_group_param(2, "lr", 0.1)
        with pytest.raises(dsopt.InvalidArgumentType):
            opt.set_group_param(0, b"lr", 0.1)
        assert opt.get_group_param(0, "beta2") == 0.999


def test_state_views_are_live_numpy_arrays_on_dsopt_memory():
    p = params(5)
    g = np.full(5, 2.0, np.float32)
    with dsopt.Optimizer(ADAM, p) as opt:
        assert opt.state_names() == ["exp_avg", "exp_avg_sq"]
        view = opt.state_view(0, "exp_avg")
        assert view.offset == 0 and view.param_numel == 5 and not view.on_device
        assert view.data.dtype == np.float32 and view.data.shape == (5,)
        np.testing.assert_array_equal(view.data, 0)
        opt.step([g])
        np.testing.assert_allclose(view.data, 0.2, rtol=1e-6)  # the same memory, updated
        np.testing.assert_allclose(opt.state_view(0, "exp_avg_sq").data, 0.004, rtol=1e-4)
        view.data[:] = 0  # written through: the next step starts from zero momentum
        blob = opt.state_dict()
        with dsopt.Optimizer(ADAM, params(5)) as other:
            other.load_state_dict(blob)
            np.testing.assert_array_equal(other.state_view(0, "exp_avg").data, 0)
        with pytest.raises(dsopt.InvalidArgument, match="exp_avg"):
            opt.state_view(0, "master")  # fp32 parameters are their own masters
        with pytest.raises(dsopt.InvalidArgument):
            opt.state_view(1, "exp_avg")


def test_a_view_keeps_its_optimizer_referenced():
    opt = dsopt.Optimizer(ADAM, params(3))
    data = opt.state_view(0, "exp_avg_sq").data
    ref = weakref.ref(opt)
    del opt
    gc.collect()
    assert ref() is not None
    np.testing.assert_array_equal(data, 0)
    del data
    gc.collect()
    assert ref() is None


def test_sixteen_bit_parameters_have_master_views():
    p = [np.linspace(-1, 1, 6).astype(np.float16)]
    with dsopt.Optimizer(ADAM, p) as opt:
        assert "master" in opt.state_names()
        np.testing.assert_array_equal(opt.state_view(0, "master").data, p[0].astype(np.float32))


def test_zero_views_hold_this_ranks_part():
    config = dict(ADAM, zero_optimization={"stage": 2})
    with dsopt.Optimizer(config, params(4, 6)) as opt:
        view = opt.state_view(1, "exp_avg")
        assert (view.offset, view.param_numel, view.data.shape) == (0, 6, (6,))  # one rank: all


def test_none_is_an_absent_gradient():
    p = params(3, 4)
    before = [a.copy() for a in p]
    g = [np.ones(3, np.float32), np.ones(4, np.float32)]
    with dsopt.Optimizer(ADAM, p) as opt:
        opt.step([g[0], None])
        assert opt.param_step(0) == 1 and opt.param_step(1) == 0
        np.testing.assert_array_equal(p[1], before[1])
        assert not np.array_equal(p[0], before[0])
        opt.step([None, g[1]])  # the kept descriptors change entry by entry
        opt.step([g[0], g[1]])
        opt.step([None, None])
        assert [opt.param_step(0), opt.param_step(1)] == [2, 2]
        with pytest.raises(dsopt.InvalidArgument):
            opt.step([None])  # the count is still checked


def test_param_steps_are_settable_for_adam_only():
    with dsopt.Optimizer(ADAM, params(3)) as opt:
        opt.set_param_step(0, 41)
        assert opt.param_step(0) == 41
        with pytest.raises(dsopt.InvalidArgument):
            opt.set_param_step(0, -1)
    onebit = {"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 2}}}
    with dsopt.Optimizer(onebit, params(3)) as opt:
        with pytest.raises(dsopt.Unsupported):
            opt.set_param_step(0, 1)
        opt.step([None])  # absent: a zero gradient for the 1-bit optimizers
        assert opt.param_step(0) == 1
