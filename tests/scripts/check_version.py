#!/usr/bin/env python3
"""The version is written once, in include/dsopt.h (DSOPT_VERSION_*), and
CMake reads it from there. Packaging files that cannot read the header
repeat it: each must agree, and CMakeLists.txt must not write its own.
Exits 1 naming each file that disagrees."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, pattern whose group 1 is the version it writes)
REPEATED = [
    ("pyproject.toml", r'(?m)^version\s*=\s*"([^"]+)"'),
    ("bindings/python/setup.py", r'version\s*=\s*"([^"]+)"'),
    ("bindings/rust/dsopt-sys/Cargo.toml", r'(?m)^version\s*=\s*"([^"]+)"'),
    ("bindings/rust/dsopt/Cargo.toml", r'(?m)^version\s*=\s*"([^"]+)"'),
    ("bindings/julia/Dsopt.jl/Project.toml", r'(?m)^version\s*=\s*"([^"]+)"'),
]


def header_version() -> str:
    text = (ROOT / "include/dsopt.h").read_text()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        found = re.findall(rf"(?m)^#define DSOPT_VERSION_{part} +(\d+)\s*$", text)
        if len(found) != 1:
            sys.exit(f"include/dsopt.h: expected one #define DSOPT_VERSION_{part}, found {len(found)}")
        parts.append(found[0])
    return ".".join(parts)


def pregenerated_rust_version() -> str:
    text = (ROOT / "bindings/rust/dsopt-sys/src/bindings.rs").read_text()
    return ".".join(re.search(rf"DSOPT_VERSION_{p}: u32 = (\d+);", text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def main() -> int:
    version = header_version()
    problems = []
    for name, pattern in REPEATED:
        match = re.search(pattern, (ROOT / name).read_text())
        if not match:
            problems.append(f"{name}: no version found")
        elif match.group(1) != version:
            problems.append(f"{name}: version {match.group(1)}, include/dsopt.h says {version}")
    rust = pregenerated_rust_version()
    if rust != version:
        problems.append(f"bindings/rust/dsopt-sys/src/bindings.rs: version {rust}, "
                        f"include/dsopt.h says {version} (regenerate it)")
    cmake = (ROOT / "CMakeLists.txt").read_text()
    if re.search(r"project\s*\(\s*dsopt\s+VERSION\s+\d", cmake):
        problems.append("CMakeLists.txt: project() writes its own version; it must read "
                        "include/dsopt.h's")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"version {version}: " + ("disagreements above" if problems else
                                    f"{len(REPEATED) + 2} places agree"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
