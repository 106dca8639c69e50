#!/usr/bin/env python3
"""Checks that the bindings keep no list of algorithm names.

What an algorithm is (its moments, hyperparameters, whether its parameters
count their own steps, whether it compresses) comes from the library's
registry (dsopt_algorithm_describe); a binding that compares a type with
"Lamb" or keeps a tuple of 1-bit types drifts from it. So no string
literal in the bindings' code (bindings/: *.py, *.rs, *.jl; not their
tests or examples, and not comments or doc text) may equal an algorithm's
type, except:

* ``_CONFIG_TYPE = "Adam"`` in a class body: the hand-written dsopt.torch
  classes name the algorithm they configure (a class the registry has no
  hand-written class for is made from its description);
* the files of ALLOWED, each with its reason.

    check_algorithm_names.py [--root DIR] [--types Adam,AdamW,...]

Without --types the types are dsopt.algorithm_names() of the dsopt package
under <root>/bindings/python (its extension built).
"""
import argparse
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]  # --root replaces it

# Files that may name algorithms, and why.
ALLOWED = {
    "bindings/python/dsopt/plan/calibrate.py":
        "the planner times the configurations it proposes, each a named algorithm to run",
    "bindings/python/dsopt/plan/configs.py":
        "the planner's candidate configurations: which algorithm each one runs",
    "bindings/python/dsopt/plan/algorithms.py":
        "the planner's baseline (AdamW, every speedup's reference) and how types are spelled in its table",
    "bindings/python/dsopt/plan/papers.py":
        "each paper's own comparison: the algorithms the paper measured",
}
# Folders whose files are not the bindings' code.
SKIPPED_PARTS = {"tests", "test", "examples", "target", "build", "__pycache__"}
SUFFIXES = (".py", ".rs", ".jl")

RUST_STRING = re.compile(r'r(#*)"(.*?)"\1|"((?:[^"\\]|\\.)*)"', re.S)
RUST_COMMENT = re.compile(r"//[^\n]*")
JULIA_STRING = re.compile(r'"""(.*?)"""|"((?:[^"\\]|\\.)*)"', re.S)
JULIA_COMMENT = re.compile(r"#=.*?=#|#[^\n]*", re.S)


def python_literals(text):
    """(line, value) of every str constant but a class body's ``_CONFIG_TYPE = "..."``."""
    tree = ast.parse(text)
    allowed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and \
                        any(isinstance(t, ast.Name) and t.id == "_CONFIG_TYPE"
                            for t in stmt.targets):
                    allowed.add(id(stmt.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in allowed:
            yield node.lineno, node.value


def rust_literals(text):
    # Comments first (doc comments, commented-out code); a "//" inside a
    # string literal is rare in this code and only hides the rest of it.
    stripped = RUST_COMMENT.sub("", text)
    for m in RUST_STRING.finditer(stripped):
        raw, plain = m.group(2), m.group(3)
        yield stripped.count("\n", 0, m.start()) + 1, raw if raw is not None else plain


def julia_literals(text):
    stripped = JULIA_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in JULIA_STRING.finditer(stripped):
        if m.group(1) is not None:
            continue  # a docstring or long text
        yield stripped.count("\n", 0, m.start()) + 1, m.group(2)


LITERALS = {".py": python_literals, ".rs": rust_literals, ".jl": julia_literals}


def binding_files(root):
    for path in sorted((root / "bindings").rglob("*")):
        rel = path.relative_to(root)
        if path.suffix in SUFFIXES and path.is_file() and \
                not SKIPPED_PARTS.intersection(rel.parts[:-1]) and rel.as_posix() not in ALLOWED:
            yield rel, path


def problems(root, types):
    types = set(types)
    found = []
    for rel, path in binding_files(root):
        for line, value in LITERALS[path.suffix](path.read_text(encoding="utf-8")):
            if value in types:
                found.append(f"{rel}:{line}: the string {value!r} names an algorithm; build the "
                             f"behaviour from dsopt_algorithm_describe (dsopt.describe) instead")
    return found


def registry_types(root):
    sys.path.insert(0, str(root / "bindings" / "python"))
    import dsopt  # noqa: E402 -- the package under root

    return dsopt.algorithm_names()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=ROOT)
    parser.add_argument("--types", help="the algorithm types, comma-separated")
    args = parser.parse_args()
    root = args.root.resolve()
    types = args.types.split(",") if args.types else registry_types(root)
    found = problems(root, types)
    for problem in found:
        print(problem, file=sys.stderr)
    files = sum(1 for _ in binding_files(root))
    print(f"check_algorithm_names: {files} files, {len(types)} types, {len(found)} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
