"""tests/scripts/check_algorithm_names.py passes on this repository and
fails on bindings whose code names an algorithm in a string literal (a
list of types, a comparison with a type) outside a hand-written class's
``_CONFIG_TYPE``."""

import pathlib
import subprocess
import sys

import dsopt

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "check_algorithm_names.py"
TYPES = "Adam,AdamW,Lamb,OneBitAdam"


def run(root=None, types=None):
    args = [sys.executable, str(SCRIPT)]
    args += ["--root", str(root)] if root else []
    args += ["--types", types] if types else []
    return subprocess.run(args, capture_output=True, text=True)


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_bindings_name_no_algorithm():
    result = run(types=",".join(dsopt.algorithm_names()))
    assert result.returncode == 0, result.stderr
    assert f"{len(dsopt.algorithm_names())} types, 0 problems" in result.stdout


def test_a_python_tuple_of_types_fails(tmp_path):
    write(tmp_path, "bindings/python/dsopt/torch/_groups.py", 'ADAM = ("Adam", "AdamW")\n')
    result = run(tmp_path, TYPES)
    assert result.returncode == 1
    assert "bindings/python/dsopt/torch/_groups.py:1: the string 'Adam' names an algorithm" \
        in result.stderr


def test_a_python_comparison_fails_and_config_type_and_doc_text_pass(tmp_path):
    write(tmp_path, "bindings/python/dsopt/a.py",
          '"""Adam and AdamW: "Lamb" in a docstring."""\n'
          'class Lamb:\n    _CONFIG_TYPE = "Lamb"\n\n'
          'def f(t):\n    return t != "Lamb"  # "Adam" in a comment\n')
    result = run(tmp_path, TYPES)
    assert result.returncode == 1
    assert result.stderr.count("names an algorithm") == 1 and "a.py:6:" in result.stderr


def test_rust_and_julia_literals_fail_but_comments_and_tests_pass(tmp_path):
    write(tmp_path, "bindings/rust/dsopt/src/lib.rs",
          '/// `{"type": "Adam"}`\n// "Adam"\nconst ONE_BIT: [&str; 1] = ["OneBitAdam"];\n'
          'const RAW: &str = r#"Lamb"#;\n')
    write(tmp_path, "bindings/rust/dsopt/tests/t.rs", 'const A: &str = "Adam";\n')
    write(tmp_path, "bindings/julia/Dsopt.jl/src/Dsopt.jl",
          '"""\n    "Adam"\n"""\nf(t) = t == "AdamW"  # "Lamb"\n')
    write(tmp_path, "bindings/julia/Dsopt.jl/examples/train.jl", 'x = "Adam"\n')
    result = run(tmp_path, TYPES)
    assert result.returncode == 1
    assert "lib.rs:3: the string 'OneBitAdam'" in result.stderr
    assert "lib.rs:4: the string 'Lamb'" in result.stderr
    assert "Dsopt.jl:4: the string 'AdamW'" in result.stderr
    assert result.stderr.count("names an algorithm") == 3


def test_the_types_come_from_the_library_by_default():
    result = run()
    assert result.returncode == 0, result.stderr
    assert f"{len(dsopt.algorithm_names())} types, 0 problems" in result.stdout
