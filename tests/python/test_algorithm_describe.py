"""dsopt.algorithm_names and dsopt.describe: the registry's description of
each algorithm, as the bindings read it."""

import dataclasses

import pytest

import dsopt
from dsopt.algorithms import BETA, FLAG, NONNEGATIVE


def test_algorithm_names_are_the_registry_types_and_each_describes_itself():
    names = dsopt.algorithm_names()
    assert len(names) == len(set(names)) and {"Adam", "AdamW", "Lion"} <= set(names)
    for name in names:
        assert dsopt.describe(name).type == name


def test_describe_takes_any_case_and_aliases():
    adam = dsopt.describe("AdamW")
    assert dsopt.describe("adamw") == adam
    for alias in adam.aliases:
        assert dsopt.describe(alias) == adam and dsopt.describe(alias.upper()) == adam


def test_unknown_type_is_invalid_argument():
    with pytest.raises(dsopt.InvalidArgument, match="unknown optimizer type"):
        dsopt.describe("NoSuchOptimizer")
    with pytest.raises(TypeError):
        dsopt.describe(3)


def test_hyperparameters_agree_with_group_params_and_the_canonical_config():
    for name in dsopt.algorithm_names():
        info = dsopt.describe(name)
        assert tuple((h.name, h.key) for h in info.hyperparameters) == dsopt.group_params(name)
        assert info.hyperparameters[0].name == "lr"
        params = dsopt.canonical_config({"optimizer": {"type": name}})["optimizer"]["params"]
        for key, names in info.hyperparameter_keys.items():
            defaults = [h.default for h in info.hyperparameters if h.key == key]
            assert (params[key] if len(names) > 1 else [params[key]]) == pytest.approx(defaults)
        for h in info.hyperparameters:
            assert h.range in (BETA, NONNEGATIVE, FLAG)
            assert isinstance(h.default, bool) == (h.range == FLAG)


def test_adam_moments_flags_and_ranges():
    adam = dsopt.describe("Adam")
    assert adam.moment_names == ("exp_avg", "exp_avg_sq") and adam.moments == 2
    assert adam.param_steps and adam.zero and not adam.compressed
    assert adam.hyperparameter_keys == {"lr": ("lr",), "betas": ("beta1", "beta2"),
                                        "eps": ("eps",), "weight_decay": ("weight_decay",)}
    ranges = {h.name: h.range for h in adam.hyperparameters}
    assert ranges == {"lr": NONNEGATIVE, "beta1": BETA, "beta2": BETA, "eps": NONNEGATIVE,
                      "weight_decay": NONNEGATIVE}
    assert "adam_w_mode" in adam.keys


def test_lion_counts_its_own_steps_with_one_moment():
    lion = dsopt.describe("Lion")
    assert lion.moment_names == ("exp_avg",) and lion.param_steps and not lion.compressed
    assert "eps" not in lion.hyperparameter_keys


def test_the_one_bit_family_is_compressed_and_counts_no_steps_per_parameter():
    compressed = [n for n in dsopt.algorithm_names() if dsopt.describe(n).compressed]
    assert compressed  # the 1-bit family
    for name in compressed:
        info = dsopt.describe(name)
        assert not info.param_steps and not info.zero


def test_the_description_is_frozen():
    info = dsopt.describe("Adam")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.type = "x"
    assert hash(info) == hash(dsopt.describe("adam"))
