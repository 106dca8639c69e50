"""The main demo (examples/python/mlp_demo.py), shortened: both optimizers
train, the loss falls, the plot and the summary are written, and on several
ranks 1-bit Adam puts fewer bytes on the wire than Adam."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEMO = os.path.join(ROOT, "examples", "python", "mlp_demo.py")


def run_demo(tmp_path, launcher):
    pytest.importorskip("matplotlib", reason="the demo's plot needs matplotlib (pip install matplotlib)")
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = tmp_path / "demo"
    cmd = launcher + [sys.executable, DEMO, "--steps", "100", "--log-every", "50", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (out / "demo.png").stat().st_size > 10000
    summary = json.loads((out / "summary.json").read_text())
    return proc.stdout, summary


def test_demo_on_one_process_trains_both_optimizers(tmp_path):
    stdout, summary = run_demo(tmp_path, [])
    assert summary["world"] == 1
    for r in summary["results"]:
        assert r["final_loss"] < 0.6 * r["initial_loss"], r
    assert "1-bit Adam" in stdout and "bytes on the wire" in stdout


def test_demo_on_four_ranks_sends_fewer_bytes_with_one_bit_adam(tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    pytest.importorskip("mpi4py", reason="the multi-rank demo needs mpi4py")
    stdout, summary = run_demo(tmp_path, ["mpirun", "-np", "4", "--oversubscribe"])
    adam, onebit = summary["results"]
    assert summary["world"] == 4
    for r in (adam, onebit):
        assert r["final_loss"] < 0.6 * r["initial_loss"], r
    assert onebit["total_bytes"] < adam["total_bytes"] / 2
    assert "compressed" in stdout
