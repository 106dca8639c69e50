"""Puts bindings/python (the dsopt package) and this folder on sys.path.

When the cffi extension is not built, only the tests that need no
extension run, and test_extension_built.py skips with the reason."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
BINDING_DIR = REPO_ROOT / "bindings" / "python"

# Read by libgomp when libdsopt loads, so before the import below.
os.environ.setdefault("OMP_NUM_THREADS", "2")

for path in (str(BINDING_DIR), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

try:
    import dsopt  # noqa: F401

    DSOPT_IMPORT_ERROR = None
except ImportError as exc:
    DSOPT_IMPORT_ERROR = f"dsopt Python extension not importable: {exc}"
    NEEDS_NO_EXTENSION = {"test_extension_built.py", "test_reference_helpers.py",
                          "test_node_aware_allreduce.py", "test_digits_cnn.py"}
    collect_ignore_glob = [
        p.name for p in HERE.glob("test_*.py") if p.name not in NEEDS_NO_EXTENSION
    ]


def subprocess_env(**extra):
    """The environment of a Python process a test starts: this one's, with
    the dsopt package and this folder importable."""
    paths = [str(BINDING_DIR), str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), **extra)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(script, args, world, one_device=False, **env):
    """``script`` (a file of this folder) with ``args`` on ``world``
    processes that find each other as torchrun's do (RANK, LOCAL_RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one OpenMP thread each.
    ``one_device``: every LOCAL_RANK is 0 (the ranks share GPU 0)."""
    env = subprocess_env(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1",
                         MASTER_PORT=str(free_port()), WORLD_SIZE=str(world), **env)
    return [subprocess.Popen([sys.executable, str(HERE / script), *map(str, args)],
                             env=dict(env, RANK=str(rank),
                                      LOCAL_RANK="0" if one_device else str(rank)),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank in range(world)]


def wait_for(procs, what, timeout=300):
    """Waits for every process of ``procs``; fails the test (killing them
    all) when one has not ended within ``timeout`` seconds or one failed.
    A failed process stops the wait at once (its peers would otherwise wait
    for it until the timeout), and its output is in the message."""
    outputs = [""] * len(procs)

    def read(rank):
        outputs[rank] = procs[rank].communicate()[0] or ""

    readers = [threading.Thread(target=read, args=(rank,), daemon=True) for rank in range(len(procs))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    while any(reader.is_alive() for reader in readers):
        failed = [rank for rank, proc in enumerate(procs) if proc.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            for proc in procs:
                proc.kill()
            for reader in readers:
                reader.join(10)
            if not failed:
                pytest.fail(f"{what} did not finish within {timeout} s")
            rank = failed[0]
            pytest.fail(f"{what}: process {rank} failed (exit code {procs[rank].returncode}; the others "
                        f"were stopped):\n{outputs[rank][-6000:]}")
        time.sleep(0.05)
    for rank, (proc, output) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"{what}: process {rank} failed:\n{output[-6000:]}"


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name (stable, different per test)
    and from $DSOPT_TEST_SEED (0 when unset) to try other data."""
    name_seed = sum(request.node.nodeid.encode()) * 7919
    return np.random.default_rng([name_seed, int(os.environ.get("DSOPT_TEST_SEED", "0"))])


def pytest_configure(config):
    # Tests that skip steps or diverge on purpose would each print the
    # binding's SkippedStepWarning or DivergenceWarning;
    # test_skip_reporting.py and test_divergence_reporting.py record them.
    if DSOPT_IMPORT_ERROR is None:
        config.addinivalue_line("filterwarnings", "ignore::dsopt.SkippedStepWarning")
        config.addinivalue_line("filterwarnings", "ignore::dsopt.DivergenceWarning")
