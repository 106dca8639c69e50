"""Conversions of scalar arguments to what the C API takes."""

import operator

from .errors import InvalidArgument, InvalidArgumentType


def _as_int(value, what: str, bits: int) -> int:
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise InvalidArgumentType(f"{what} must be an int, got a bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise InvalidArgumentType(f"{what} must be an int, got {type(value).__name__}") from None
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise InvalidArgument(f"{what} = {value} does not fit in int{bits}")
    return value


def as_int32(value, what: str) -> int:
    return _as_int(value, what, 32)


def as_int64(value, what: str) -> int:
    return _as_int(value, what, 64)


def as_float(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgumentType(f"{what} must be a number, got {type(value).__name__}") from None
