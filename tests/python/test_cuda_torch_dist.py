"""dsopt.torch on CUDA parameters at 2 processes (cuda_dist_worker.py):
two ranks sharing one GPU over torch.distributed's gloo (launched as
torchrun launches them) and over mpi4py under mpirun run every
configuration of cuda_lockstep.CONFIGS, fp32 and bf16, in lockstep with
the same configuration on CPU parameters: bit-identical after every step,
the ranks identical, the model trained. The torch communicator's
collectives run on the GPU's buffers as dsopt hands them over (read-only
send buffers included). NCCL: one rank on one GPU (the collectives really
called), and 2 ranks where the machine has 2 GPUs.

Skips without a GPU (`make test-gpu` runs it on one; DSOPT_TEST_DEVICE=cpu
dry-runs it on the CPU)."""

import json
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import conftest  # noqa: E402
import cuda_lockstep as ls  # noqa: E402
from dsopt_testing import mpi4py_missing  # noqa: E402

if ls.missing():
    if ls.REQUIRED:
        pytest.fail(ls.missing(), pytrace=False)
    pytest.skip(ls.missing(), allow_module_level=True)

KEYS = [f"{name}.{dtype}" for name in ls.CONFIGS for dtype in ls.DTYPES]
KEYS += [f"{name}.{dtype}.prefetch" for name in ls.ZERO_CONFIGS for dtype in ls.DTYPES]
TIMEOUT = 400


def launch(backend, world, out_dir):
    if backend == "mpi":
        why = mpi4py_missing()
        if why:
            if ls.REQUIRED:
                pytest.fail(why)
            pytest.skip(why)
        env = conftest.subprocess_env(OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                                      OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = [shutil.which("mpirun"), "-np", str(world), "--oversubscribe", sys.executable,
               str(conftest.HERE / "cuda_dist_worker.py"), "mpi", str(out_dir)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert proc.returncode == 0, f"mpirun -np {world} failed:\n{proc.stdout}{proc.stderr}"
    else:
        procs = conftest.start_ranks("cuda_dist_worker.py", [backend, out_dir], world)
        conftest.wait_for(procs, f"cuda_dist_worker.py {backend}", timeout=TIMEOUT)
    reports = [json.loads((out_dir / f"{backend}-rank{r}.json").read_text()) for r in range(world)]
    for rank, report in enumerate(reports):
        assert report.get("finished"), f"{backend} rank {rank} did not finish"
    return reports


@pytest.fixture(scope="module", params=["gloo", "mpi"])
def two_ranks(request, tmp_path_factory):
    return request.param, launch(request.param, 2, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("key", KEYS)
def test_two_ranks_on_one_gpu_step_as_on_the_cpu(two_ranks, key):
    backend, reports = two_ranks
    runs = [report["runs"][key] for report in reports]
    for rank, run in enumerate(runs):
        assert "error" not in run, f"{backend} rank {rank}, {key}:\n{run['error']}"
        assert run["mismatch"] is None, f"{backend} rank {rank}: {run['mismatch']}"
    assert runs[0]["params"] == runs[1]["params"], f"{backend} {key}: the ranks differ"
    losses = [sum(run["losses"][i] for run in runs) for i in range(ls.STEPS)]
    assert sum(losses[-3:]) < sum(losses[:3]), f"{backend} {key} did not train: {losses}"
    if key.startswith(("OneBit", "ZeroOne")):
        assert any(runs[0]["compressed"]), f"{backend} {key} never compressed"


def test_torch_collectives_on_gpu_buffers_over_gloo(two_ranks):
    backend, reports = two_ranks
    if backend != "gloo":
        pytest.skip("the torch communicator's collectives are checked over gloo and NCCL")
    for rank, report in enumerate(reports):
        assert report["device"].startswith(ls.DEVICE.type)
        assert report["collectives"]["problems"] == [], f"rank {rank}"


def _nccl(world):
    if ls.DEVICE.type != "cuda" or not torch.distributed.is_nccl_available():
        pytest.skip("NCCL needs CUDA and a torch build with NCCL")
    if torch.cuda.device_count() < world:
        pytest.skip(f"NCCL at {world} ranks needs {world} GPUs (one per rank); this machine has "
                    f"{torch.cuda.device_count()}")


@pytest.mark.parametrize("world", [1, 2])
def test_nccl_ranks_step_as_on_the_cpu(world, tmp_path):
    _nccl(world)
    reports = launch("nccl", world, tmp_path)
    for rank, report in enumerate(reports):
        assert report["collectives"]["problems"] == [], f"rank {rank}"
        assert report["collectives"]["fallbacks"] == [], report["collectives"]
        for key in KEYS:
            run = report["runs"][key]
            assert "error" not in run, f"nccl rank {rank}, {key}:\n{run['error']}"
            assert run["mismatch"] is None, f"nccl rank {rank}: {run['mismatch']}"
    for key in KEYS:
        assert len({report["runs"][key]["params"] for report in reports}) == 1, key
