#!/usr/bin/env python3
"""Checks that the source folders form a strict hierarchy.

Every folder of src/ (and cuda/, the CUDA kernels) has a place
in LAYERS, lowest first. A file may include headers of its own folder and of
folders below it, never above: `#include "optim/..."` in src/zero fails.
Within the library the headers must not include each other in a cycle
either. A folder missing from LAYERS fails too, so a new one is placed on
purpose. docs/development.md ("Layers") explains the order.

    check_layers.py [--graph] [--root DIR]   (--graph prints the folder include graph)
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]  # --root replaces it

# Lowest first; folders on one line are one layer (they may not include
# each other).
LAYERS = [
    ["base"],
    ["math"],
    ["kernels"],
    ["cuda"],  # the CUDA implementation of the kernel interface
    ["state"],
    ["comm"],
    ["params"],
    ["handover"],
    ["zero"],
    ["optim"],
    ["config"],  # reading and checking a JSON config's values
    ["algorithms"],  # a folder per algorithm family (descriptor, class, helpers) and the registry
    ["facade"],  # the object behind a dsopt_optimizer handle: parts + one algorithm
    ["api"],
]
RANK = {folder: level for level, folders in enumerate(LAYERS) for folder in folders}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".hpp", ".cpp", ".cuh", ".cu", ".inl", ".h")


def folder_of(path):
    rel = path.relative_to(ROOT)
    return rel.parts[0] if rel.parts[0] == "cuda" else rel.parts[1]


def files():
    for top in (ROOT / "src", ROOT / "cuda"):
        for path in sorted(top.rglob("*")):
            if path.suffix in SOURCES:
                yield path


def resolve(path, name):
    """The repository file an include names, or None (system or public header)."""
    for base in (path.parent, ROOT / "src", ROOT / "cuda"):
        candidate = (base / name).resolve()
        if candidate.is_file() and ROOT in candidate.parents:
            return candidate
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="store_true", help="print the folder include graph")
    parser.add_argument("--root", type=pathlib.Path, help="the repository to check (default: this one)")
    args = parser.parse_args()
    global ROOT
    if args.root:
        ROOT = args.root.resolve()
    errors, edges, graph = [], {}, {}
    for path in files():
        folder = folder_of(path)
        if folder not in RANK:
            errors.append(f"{path.relative_to(ROOT)}: folder {folder!r} has no place in LAYERS")
            continue
        graph.setdefault(path, [])
        for name in INCLUDE.findall(path.read_text()):
            target = resolve(path, name)
            if target is None:
                continue
            graph[path].append(target)
            other = folder_of(target)
            if other == folder:
                continue
            edges.setdefault(folder, set()).add(other)
            if other not in RANK or RANK[other] >= RANK[folder]:
                errors.append(f"{path.relative_to(ROOT)} includes {name}: {other} is not below "
                              f"{folder}")
    errors += cycles(graph)
    if args.graph:
        for level, folders in enumerate(LAYERS):
            for folder in folders:
                below = " ".join(sorted(edges.get(folder, ()), key=lambda f: RANK.get(f, -1)))
                print(f"{level} {folder:9} -> {below or '(nothing)'}")
    for error in errors:
        print(error, file=sys.stderr)
    print(f"check_layers: {len(graph)} files, {len(LAYERS)} layers, {len(errors)} problems")
    return 1 if errors else 0


def cycles(graph):
    """Include cycles between files, one message per cycle found."""
    state, found = {}, []

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                loop = stack[stack.index(nxt):] + [nxt]
                found.append("include cycle: " + " -> ".join(str(p.relative_to(ROOT)) for p in loop))
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    sys.setrecursionlimit(10000)
    for node in graph:
        if node not in state:
            visit(node, [])
    return found


if __name__ == "__main__":
    sys.exit(main())
