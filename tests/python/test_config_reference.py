"""docs/reference/config.md against the library: its table lists exactly
the keys the library knows in each part of a config (read from the library's
own "known here" error for a key it does not know), giving a key its
documented default changes nothing (the parameters and the state blob after
three steps, its run id aside, are byte-identical to those of the config
without the key), and every bound the
table states is where the library rejects a value."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

import dsopt
from test_blob_compat import sections

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "config.md"
TYPES = tuple(dsopt.algorithm_names())


def rows():
    out = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        key, kinds, default, bounds = cells[0].strip("`"), cells[1], cells[2], cells[3]
        types = TYPES if kinds == "all" else tuple(t.strip() for t in kinds.split(","))
        assert set(types) <= set(TYPES), line
        out.append((key, types, default, bounds))
    return out


ROWS = rows()


def base(kind, key=""):
    """A config every key of `key`'s part can be set in."""
    cfg = {"optimizer": {"type": kind}, "threads": 1}
    if key.startswith("fp16.") and key != "fp16.enabled":
        cfg["fp16"] = {"enabled": True}
    if key.startswith("zero_optimization.") and key != "zero_optimization.stage":
        cfg["zero_optimization"] = {"stage": 2}
    if key == "divergence_check.window":
        cfg["divergence_check"] = {"count": 1}
    if key.endswith(".nesterov"):  # Nesterov needs momentum
        cfg["optimizer"]["params"] = {"momentum": 0.9}
    return cfg


def put(cfg, key, value):
    cfg = json.loads(json.dumps(cfg))
    if key.startswith("param_groups[]."):
        cfg["param_groups"] = [{key.split(".", 1)[1]: value}]
        return cfg
    node, parts = cfg, key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return cfg


def params():
    rng = np.random.default_rng(4)
    return [rng.standard_normal(n).astype(np.float32) for n in (40, 7)]


def run(cfg):
    """The parameters after three steps, and the state blob's sections but
    the run id (which hashes the config's text)."""
    p = params()
    with dsopt.Optimizer(cfg, p) as opt:
        for step in range(3):
            rng = np.random.default_rng(step)
            opt.step([rng.standard_normal(x.size).astype(np.float32) for x in p])
        state = [(name, data) for name, data in sections(opt.state_dict())[1] if name != "common.run"]
    return b"".join(x.tobytes() for x in p), state


def accepted(cfg):
    try:
        dsopt.Optimizer(cfg, params()).close()
        return True
    except dsopt.DsoptError:
        return False


def known_keys(cfg):
    """The keys the library knows where `cfg` holds the key "bogus_key"."""
    with pytest.raises(dsopt.InvalidArgument) as error:
        dsopt.Optimizer(cfg, params())
    match = re.search(r"known here: (.*)\)", str(error.value))
    assert match, str(error.value)
    return set(match.group(1).split(", "))


def documented(prefix, kind):
    """The documented keys right below `prefix` ("" for the top level)."""
    keys = set()
    per_type = prefix in ("optimizer.params", "param_groups[]")  # elsewhere the same for all
    for key, types, _, _ in ROWS:
        if per_type and kind not in types:
            continue
        if prefix == "":
            keys.add(re.split(r"[.\[]", key)[0])
        elif key.startswith(prefix + "."):
            keys.add(key[len(prefix) + 1:].split(".")[0])
    return keys


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("part", ["", "optimizer", "optimizer.params", "param_groups[]", "fp16",
                                  "bf16", "zero_optimization",
                                  "zero_optimization.offload_optimizer", "zero_optimization.compression",
                                  "divergence_check", "topology"])
def test_the_table_lists_exactly_the_keys_the_library_knows(part, kind):
    cfg = base(kind, part + ".x")
    if part.startswith("zero_optimization.") and not dsopt.describe(kind).zero:
        pytest.skip("ZeRO is for the moment rules")
    if part.startswith("zero_optimization."):
        cfg["zero_optimization"] = {"stage": 2, part.split(".")[1]: {}}
    probe = put(cfg, part + ".bogus_key" if part else "bogus_key", 1)
    assert known_keys(probe) == documented(part, kind)


def literal(text):
    text = text.strip("`")
    try:
        return json.loads(text)
    except ValueError:
        return None


@pytest.mark.parametrize("key,types,default,bounds",
                         [r for r in ROWS if literal(r[2]) is not None], ids=lambda v: str(v)[:40])
def test_a_key_at_its_documented_default_changes_nothing(key, types, default, bounds):
    for kind in types[:2]:
        cfg = base(kind, key)
        assert run(put(cfg, key, literal(default))) == run(cfg), (kind, key)


def bound_cases(bounds):
    """(value, accepted) pairs a bound implies; [] when it is not numeric."""
    b = bounds.replace("2^", "2**")
    if m := re.fullmatch(r">= (-?[\d.e-]+)", b):
        x = float(m.group(1))
        return [(x, True), (x - (1 if x == 0 else abs(x) / 2), False)]
    if m := re.fullmatch(r"> (-?[\d.e-]+)", b):
        x = float(m.group(1))
        return [(x, False), (x + (1e-3 if x == 0 else abs(x) / 2), True)]
    if m := re.fullmatch(r"(\d+) \.\. (\d+(?:\*\*\d+)?)", b):
        lo, hi = int(m.group(1)), int(eval(m.group(2)))  # noqa: S307 - digits and ** only
        return [(lo, True), (lo - 1, False), (hi, True), (hi + 1, False)]
    if b in ("in [0, 1)", "each in [0, 1)"):
        return [(0.0, True), (0.5, True), (1.0, False), (-0.1, False)]
    if b == "true, false":
        return [(True, True), (False, True), ("yes", False)]
    if b in ("true", "false"):
        return [(b == "true", True), (b != "true", False)]
    return []


@pytest.mark.parametrize("key,types,default,bounds",
                         [r for r in ROWS if bound_cases(r[3])], ids=lambda v: str(v)[:40])
def test_the_documented_bounds_are_the_librarys(key, types, default, bounds):
    kind = types[0]
    for value, ok in bound_cases(bounds):
        if key.endswith("betas"):
            value = [value, 0.999]
        cfg = put(base(kind, key), key, value)
        assert accepted(cfg) == ok, (kind, key, value, ok)
