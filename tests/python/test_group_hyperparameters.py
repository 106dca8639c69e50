"""Every algorithm's group hyperparameters as its descriptor lists them:
the names and config keys (dsopt.group_params, written out here by hand),
get and set by name with what the algorithm lacks refused, the blob's hyper
section holding exactly the algorithm's values (Adam-family: beta1, beta2,
eps, weight_decay; Lion: no eps) and round-tripping them, Lion blobs of the
earlier layout (an unused eps slot per group) loading, and damaged hyper
sections refused without changing anything."""

import struct

import numpy as np
import pytest

import dsopt
from test_blob_compat import pack, sections

ADAM_FAMILY = ("Adam", "AdamW", "Lamb", "OneBitAdam", "OneBitLamb", "ZeroOneAdam")
ADAM_PARAMS = (("lr", "lr"), ("beta1", "betas"), ("beta2", "betas"), ("eps", "eps"),
               ("weight_decay", "weight_decay"))
LION_PARAMS = (("lr", "lr"), ("beta1", "betas"), ("beta2", "betas"),
               ("weight_decay", "weight_decay"))
EXPECTED = dict({t: ADAM_PARAMS for t in ADAM_FAMILY}, Lion=LION_PARAMS)
SIZES = (33, 7, 100)


def config(optimizer_type):
    groups = [{"betas": [0.8, 0.95]}, {"lr": 0.003, "weight_decay": 0.1}]
    if optimizer_type != "Lion":
        groups[1]["eps"] = 1e-4
    return {"optimizer": {"type": optimizer_type, "params": {"lr": 0.01, "weight_decay": 0.02}},
            "param_groups": groups, "threads": 1}


def make(optimizer_type, seed=0):
    rng = np.random.default_rng(seed)
    params = [rng.standard_normal(n).astype(np.float32) for n in SIZES]
    return params, dsopt.Optimizer(config(optimizer_type), params, groups=[0, 1, 1])


def grads(step):
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(n).astype(np.float32) for n in SIZES]


def values(opt):
    return [[opt.get_group_param(g, n) for n in opt.group_param_names] for g in range(2)]


def hyper_of(blob):
    return dict(sections(blob)[1])["common.hyper"]


def with_hyper(blob, data):
    prefix, parts = sections(blob)
    return pack(prefix, [(n, data if n == "common.hyper" else d) for n, d in parts])


@pytest.mark.parametrize("optimizer_type", sorted(EXPECTED))
def test_names_keys_and_get_set(optimizer_type):
    assert dsopt.group_params(optimizer_type) == EXPECTED[optimizer_type]
    assert dsopt.group_params(optimizer_type.lower()) == EXPECTED[optimizer_type]
    params, opt = make(optimizer_type)
    with opt:
        assert opt.group_param_names == tuple(n for n, _ in EXPECTED[optimizer_type])
        before = values(opt)
        assert before[1][0] == 0.003 and before[0][1:3] == [0.8, 0.95]
        for name, value in (("momentum", 0.5), ("beta1", 1.0), ("weight_decay", -1.0),
                            ("lr", float("nan"))) + ((("eps", 1e-6),) if optimizer_type == "Lion"
                                                     else ()):
            with pytest.raises(dsopt.InvalidArgument, match="nothing was changed"):
                opt.set_group_param(1, name, value)
        with pytest.raises(dsopt.InvalidArgument, match="has no hyperparameter"):
            opt.get_group_param(0, "momentum")
        assert values(opt) == before
        for i, name in enumerate(opt.group_param_names):
            opt.set_group_param(1, name, 0.5 - 0.0625 * i)
        assert values(opt)[1] == [0.5 - 0.0625 * i for i in range(len(opt.group_param_names))]
        group = opt.config["param_groups"][1]
        assert set(group) - {"non_freeze"} == {k for _, k in EXPECTED[optimizer_type]}
        assert group["betas"] == [0.4375, 0.375]


def test_unknown_type_is_refused():
    with pytest.raises(dsopt.InvalidArgument, match="NoSuchOptimizer"):
        dsopt.group_params("NoSuchOptimizer")


@pytest.mark.parametrize("optimizer_type", sorted(EXPECTED))
def test_blob_holds_the_algorithms_values_and_round_trips(optimizer_type):
    params, opt = make(optimizer_type)
    names = opt.group_param_names
    opt.step(grads(0))
    for i, name in enumerate(names):
        opt.set_group_param(1, name, 0.5 - 0.0625 * i)
    saved = values(opt)
    blob = opt.state_dict()
    stored = struct.unpack(f"<{len(hyper_of(blob)) // 8}d", hyper_of(blob))
    assert stored == tuple(saved[0][1:] + saved[1][1:])  # every name but lr, per group
    params2, opt2 = make(optimizer_type, seed=1)
    for p, q in zip(params2, params):
        p[...] = q
    opt2.load_state_dict(blob)
    assert values(opt2) == saved
    for k in (1, 2):
        opt.step(grads(k))
        opt2.step(grads(k))
    for p, q in zip(params, params2):
        np.testing.assert_array_equal(p, q)
    assert opt2.state_dict() == opt.state_dict()
    opt.close()
    opt2.close()


def test_adam_family_section_is_beta1_beta2_eps_weight_decay():
    _, opt = make("AdamW")
    with opt:
        opt.set_group_param(0, "eps", 3e-7)
        stored = struct.unpack("<8d", hyper_of(opt.state_dict()))
        assert stored == (0.8, 0.95, 3e-7, 0.02, 0.9, 0.999, 1e-4, 0.1)


def test_lion_blob_of_the_earlier_layout_loads():
    """Lion blobs used to hold beta1, beta2, eps, weight_decay per group
    (eps unused): they load, the eps slot ignored, and the run continues
    as one that never stopped."""
    params, opt = make("Lion")
    opt.step(grads(0))
    opt.set_group_param(1, "beta2", 0.9)
    opt.set_group_param(0, "weight_decay", 0.25)
    blob = opt.state_dict()
    b1, b2, wd, c1, c2, cwd = struct.unpack("<6d", hyper_of(blob))
    old = with_hyper(blob, struct.pack("<8d", b1, b2, 1e-8, wd, c1, c2, 12345.0, cwd))
    params2, opt2 = make("Lion", seed=1)
    for p, q in zip(params2, params):
        p[...] = q
    opt2.load_state_dict(old)
    assert values(opt2) == values(opt)
    for k in (1, 2, 3):
        opt.step(grads(k))
        opt2.step(grads(k))
    for p, q in zip(params, params2):
        np.testing.assert_array_equal(p, q)
    assert opt2.state_dict() == opt.state_dict()  # saved again in Lion's own layout
    opt.close()
    opt2.close()


@pytest.mark.parametrize("optimizer_type", ["AdamW", "Lion"])
@pytest.mark.parametrize("damage", ["beta_one", "nan", "negative_decay", "short", "long"])
def test_damaged_hyper_section_is_refused_and_changes_nothing(optimizer_type, damage):
    params, opt = make(optimizer_type)
    opt.step(grads(0))
    blob = opt.state_dict()
    n = len(hyper_of(blob)) // 8
    v = list(struct.unpack(f"<{n}d", hyper_of(blob)))
    data = {
        "beta_one": lambda: struct.pack(f"<{n}d", 1.0, *v[1:]),
        "nan": lambda: struct.pack(f"<{n}d", *v[:1], float("nan"), *v[2:]),
        "negative_decay": lambda: struct.pack(f"<{n}d", *v[:-1], -0.5),
        "short": lambda: hyper_of(blob)[:-8],
        "long": lambda: hyper_of(blob) + struct.pack("<d", 0.0),
    }[damage]()
    params2, opt2 = make(optimizer_type, seed=1)
    before, snapshot = values(opt2), [p.copy() for p in params2]
    blob2 = opt2.state_dict()
    with pytest.raises(dsopt.CorruptState):
        opt2.load_state_dict(with_hyper(blob, data))
    assert values(opt2) == before
    for p, q in zip(params2, snapshot):
        np.testing.assert_array_equal(p, q)
    assert opt2.state_dict() == blob2
    opt.close()
    opt2.close()
