"""tests/scripts/check_layers.py passes on this repository and fails on a
tree whose folders include upwards, whose headers include each other in a
cycle, or that has a folder with no layer."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "check_layers.py"


def run(root=None):
    args = [sys.executable, str(SCRIPT)] + (["--root", str(root)] if root else [])
    return subprocess.run(args, capture_output=True, text=True)


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_this_repository_is_layered():
    result = run()
    assert result.returncode == 0, result.stderr


def test_an_upward_include_fails(tmp_path):
    write(tmp_path, "src/optim/a.hpp", "#pragma once\n")
    write(tmp_path, "src/zero/b.cpp", '#include "optim/a.hpp"\n')
    result = run(tmp_path)
    assert result.returncode == 1
    assert "src/zero/b.cpp includes optim/a.hpp: optim is not below zero" in result.stderr


def test_a_header_cycle_fails(tmp_path):
    write(tmp_path, "src/comm/a.hpp", '#include "comm/b.hpp"\n')
    write(tmp_path, "src/comm/b.hpp", '#include "comm/a.hpp"\n')
    result = run(tmp_path)
    assert result.returncode == 1
    assert "include cycle: src/comm/a.hpp -> src/comm/b.hpp -> src/comm/a.hpp" in result.stderr


def test_a_folder_without_a_layer_fails(tmp_path):
    write(tmp_path, "src/extras/x.cpp", '#include "base/error.hpp"\n')
    write(tmp_path, "src/base/error.hpp", "#pragma once\n")
    result = run(tmp_path)
    assert result.returncode == 1
    assert "folder 'extras' has no place in LAYERS" in result.stderr
