"""Parsing of the planner's quantities: counts (``1.3e9``, ``7B``, ``125M``),
bandwidths (``25gbit``, ``400Gbps``, ``12.5GB/s``; stored in bytes per
second) and latencies (``5us``, ``1.5ms``; stored in seconds). Bad input is
a ``ValueError`` that names the quantity and the accepted forms."""

import re

_COUNT_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

# Bandwidth units -> bytes per second per unit.
_BANDWIDTH = {
    "bit": 1 / 8, "bps": 1 / 8, "bit/s": 1 / 8,
    "kbit": 1e3 / 8, "kbps": 1e3 / 8, "kbit/s": 1e3 / 8,
    "mbit": 1e6 / 8, "mbps": 1e6 / 8, "mbit/s": 1e6 / 8,
    "gbit": 1e9 / 8, "gbps": 1e9 / 8, "gbit/s": 1e9 / 8,
    "tbit": 1e12 / 8, "tbps": 1e12 / 8, "tbit/s": 1e12 / 8,
}
# Byte units are case-sensitive in the last letter: "GB/s" is bytes.
_BYTE_RATE = {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
              "KiB/s": 2 ** 10, "MiB/s": 2 ** 20, "GiB/s": 2 ** 30}

_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_count(text, what="count") -> int:
    """A positive count: an int, or text such as ``1.3e9``, ``350M``, ``7B``."""
    if isinstance(text, bool):
        raise ValueError(f"{what}: expected a number, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*([kKmMbBgGtT]?)", str(text).strip())
        if not m:
            raise ValueError(f"{what}: cannot read {text!r} (examples: 1.3e9, 350M, 7B)")
        value = float(m.group(1)) * _COUNT_SUFFIX[m.group(2).lower()]
    if not value >= 1 or value != value:
        raise ValueError(f"{what}: must be at least 1, got {text!r}")
    return int(round(value))


def parse_bandwidth(text, what="bandwidth") -> float:
    """Bytes per second from ``25gbit``, ``25 Gbit/s``, ``400Gbps``,
    ``12.5GB/s`` (bytes), ``900GiB/s``, or a number (bytes per second)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*([A-Za-z/]+)", str(text).strip())
        if not m:
            raise ValueError(f"{what}: cannot read {text!r} (examples: 25gbit, 400Gbps, 12.5GB/s)")
        number, unit = float(m.group(1)), m.group(2)
        if unit in _BYTE_RATE:
            value = number * _BYTE_RATE[unit]
        elif _BANDWIDTH.get(unit.lower()) is not None:
            value = number * _BANDWIDTH[unit.lower()]
        else:
            raise ValueError(f"{what}: unknown unit {unit!r} in {text!r} (bits: bit, kbit, mbit, "
                             "gbit, tbit, Gbps, Gbit/s; bytes: B/s, MB/s, GB/s, GiB/s)")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{what}: must be positive and finite, got {text!r}")
    return value


def parse_time(text, what="time") -> float:
    """Seconds from ``5us``, ``1.5ms``, ``0.2s`` or a number (seconds); >= 0."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-zµ]*)", str(text).strip())
        if not m or (m.group(2) or "s") not in _TIME:
            raise ValueError(f"{what}: cannot read {text!r} (examples: 5us, 1.5ms, 0.2s)")
        value = float(m.group(1)) * _TIME[m.group(2) or "s"]
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{what}: must be zero or positive and finite, got {text!r}")
    return value


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def format_rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e9:g} Gbit/s"
