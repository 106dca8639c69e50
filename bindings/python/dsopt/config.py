"""The JSON config text handed to dsopt_create, and per-parameter groups.

``groups`` (optional, one entry per parameter) is either

* a list of ints: the group index of each parameter, indexing the config's
  ``param_groups`` list; or
* a list of dicts: per-parameter overrides (``lr``, ``betas``, ``eps``,
  ``weight_decay``). Equal dicts share a group; groups are numbered in order
  of first appearance and written into the config as ``param_groups`` (so the
  config must not have its own). ``{}`` is a group without overrides.
"""

import json

from ._lib import ffi, lib
from .errors import InvalidArgument, InvalidArgumentType, check


def _as_dict(config) -> dict:
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, (bytes, bytearray)):
        config = bytes(config).decode("utf-8")
    if isinstance(config, str):
        try:
            parsed = json.loads(config)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"config is not valid JSON: {exc}") from exc
        if not isinstance(parsed, dict):
            raise InvalidArgumentType(f"config must be a JSON object, got {type(parsed).__name__}")
        return parsed
    raise InvalidArgumentType(f"config must be a dict or JSON text, got {type(config).__name__}")


def _config_text(config) -> str:
    if isinstance(config, str):
        return config
    if isinstance(config, (bytes, bytearray)):
        return bytes(config).decode("utf-8")
    if isinstance(config, dict):
        try:
            return json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentType(f"config cannot be written as JSON: {exc}") from exc
    raise InvalidArgumentType(f"config must be a dict or JSON text, got {type(config).__name__}")


def _group_key(overrides: dict) -> str:
    return json.dumps(overrides, sort_keys=True)


def resolve(config, groups, num_params: int):
    """Returns (config JSON text, list of group indices or None)."""
    if groups is None:
        return _config_text(config), None
    groups = list(groups)
    if len(groups) != num_params:
        raise InvalidArgument(f"groups has {len(groups)} entries for {num_params} parameters")
    if all(isinstance(g, dict) for g in groups):
        as_dict = _as_dict(config)
        if "param_groups" in as_dict:
            raise InvalidArgument("groups given as dicts, but the config already has param_groups")
        index_of = {}
        param_groups = []
        indices = []
        for overrides in groups:
            key = _group_key(overrides)
            if key not in index_of:
                index_of[key] = len(param_groups)
                param_groups.append(dict(overrides))
            indices.append(index_of[key])
        as_dict["param_groups"] = param_groups
        return _config_text(as_dict), indices
    if any(isinstance(g, dict) for g in groups):
        raise InvalidArgumentType("groups must be all ints or all dicts, not a mix")
    return _config_text(config), groups


def read_text(fill) -> str:
    """The text of a call with dsopt's string-buffer convention:
    ``fill(dst, capacity, out_size)`` asked for the size, then filled."""
    size = ffi.new("uint64_t *")
    check(fill(ffi.NULL, 0, size))
    buf = ffi.new("char[]", int(size[0]))
    check(fill(buf, int(size[0]), size))
    return ffi.string(buf).decode("utf-8")


def canonical(config) -> dict:
    """The canonical form of a config (``dsopt_config_canonical``): every
    key with its effective value, defaults filled in and aliases resolved,
    as ``dsopt.Optimizer.config`` of an optimizer created from it. Raises
    what ``dsopt.Optimizer`` would for a bad config."""
    text = _config_text(config).encode("utf-8")
    return json.loads(read_text(lambda dst, cap, size: lib.dsopt_config_canonical(text, dst, cap, size)))


def group_params(optimizer_type) -> tuple:
    """The group hyperparameters of the algorithm ``optimizer_type`` (a
    config's ``optimizer.type``, any case or alias), in order, each as
    ``(name, key)``: the name ``Optimizer.get_group_param`` takes and its
    config key, e.g. ``("beta1", "betas")`` (``dsopt_group_param_names``; a
    key named more than once is a list of those values). Raises
    ``InvalidArgument`` for an unknown type."""
    if not isinstance(optimizer_type, str):
        raise InvalidArgumentType(f"optimizer_type must be a str, got {type(optimizer_type).__name__}")
    names, keys = ffi.new("const char **"), ffi.new("const char **")
    check(lib.dsopt_group_param_names(optimizer_type.encode("utf-8"), names, keys))
    return tuple(zip(ffi.string(names[0]).decode().split(), ffi.string(keys[0]).decode().split()))


__all__ = ["canonical", "group_params", "resolve"]
