#!/usr/bin/env bash
# `make test-gpu`: everything that needs a GPU, in one command on a machine
# with one (or more) NVIDIA GPUs, CUDA's nvcc, CMake and a Python with
# CUDA torch:
#   1. builds libdsopt with CUDA for the GPU it finds (that architecture
#      only) and the GPU tests, with every core;
#   2. the C GPU tests (ctest -L gpu: CUDA against the CPU bit for bit, the
#      compressed-allreduce kernels, NCCL on one rank, 2 MPI ranks on the GPU);
#   3. the Python CUDA tests: dsopt.torch on CUDA parameters in one process
#      and at 2 processes over gloo, mpi4py and NCCL (test_cuda_torch*.py),
#      the DDP hook, dsopt.hf.Trainer and DsoptStrategy on a CUDA model (2
#      processes on one GPU), and the CUDA cases of the torch.optim port;
#   4. the GPU benchmarks (`make bench-gpu`: bench/adam_cuda.cu beside torch's
#      fused AdamW) and
#      the planner's calibration on the GPU.
# A missing GPU, a library without CUDA or a CUDA test that skips for want
# of one fails the run (DSOPT_REQUIRE_CUDA=1); what needs two GPUs skips on one.
# DEPS=DIR: the folder of scripts/offline_deps.sh for a machine without
# package registries. Prints the GPU, torch's version, each part's counts
# and the seconds taken. GPU_TEST_TIMEOUT=S (default 300): the longest a
# single C test or pytest case may take before it counts as hung.
#   tests/gpu/run_gpu_suite.sh [BUILD_DIR]   (default build-gpu)
set -uo pipefail

build=${1:-build-gpu}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
if [ -n "${DEPS:-}" ]; then
  eval "$(scripts/offline_deps.sh env "$DEPS")" || exit 1
fi
py=${PYTHON:-python3}
command -v nvcc >/dev/null 2>&1 || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="$PATH:/usr/local/cuda/bin"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started )) s"; }
failures=()
per_test=${GPU_TEST_TIMEOUT:-300}
pytest_timeout=()
"$py" -c 'import pytest_timeout' 2>/dev/null && pytest_timeout=(--timeout "$per_test")

if ! gpus=$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version \
                       --format=csv,noheader 2>/dev/null) || [ -z "$gpus" ]; then
  echo "test-gpu: no NVIDIA GPU here (nvidia-smi found none); run it on a machine with one" >&2
  exit 1
fi
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')
echo "test-gpu: $(echo "$gpus" | wc -l) GPU(s): $gpus"
echo "test-gpu: nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p'), sm_$arch"
echo "test-gpu: $("$py" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1)"

# ---- 1. build -------------------------------------------------------------------------
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DDSOPT_BUILD_TESTS=ON \
  -DDSOPT_BUILD_BENCH=ON -DDSOPT_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null ||
  { echo "test-gpu: cmake configure failed" >&2; exit 1; }
targets=(dsopt gpu_tests)
[ -d "$build/CMakeFiles/dsopt_mpi.dir" ] && targets+=(dsopt_mpi)
grep -qx adam_cuda_bench "$build/bench/benchmarks.txt" 2>/dev/null && targets+=(adam_cuda_bench)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" >"$build/test-gpu-build.log" 2>&1 ||
  { tail -n 40 "$build/test-gpu-build.log"; echo "test-gpu: build failed" >&2; exit 1; }
echo "test-gpu: built ${targets[*]} ($(elapsed))"

# ---- 2. C GPU tests -------------------------------------------------------------------
if ! (cd "$build" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        ctest -L gpu --output-on-failure --timeout "$per_test"); then
  failures+=("C GPU tests")
fi
echo "test-gpu: C GPU tests done ($(elapsed))"

# ---- 3. Python CUDA tests --------------------------------------------------------------
if DSOPT_LIBRARY_DIR="$build" "$py" bindings/python/dsopt/_ffi_build.py >/dev/null; then
  if ! DSOPT_LIBRARY_DIR="$build" DSOPT_REQUIRE_CUDA=1 DSOPT_DDP_DEVICE=cuda DSOPT_HF_DEVICE=cuda \
       DSOPT_LIGHTNING_DEVICE=cuda \
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
       "$py" -m pytest -q -rs -p no:cacheprovider --durations=10 "${pytest_timeout[@]}" \
         tests/python/test_cuda_torch.py tests/python/test_cuda_torch_dist.py \
         tests/python/test_ddp_hook.py tests/python/test_hf_trainer.py \
         tests/python/test_lightning_strategy.py tests/python/test_torch_optim_port.py \
         tests/python/test_codec.py tests/python/test_fsdp_codes.py \
         -k "cuda or ddp or hf_trainer or two_processes or two_gpus"; then
    failures+=("Python CUDA tests")
  fi
else
  failures+=("the cffi extension (pip install cffi, or DEPS=DIR)")
fi
echo "test-gpu: Python CUDA tests done ($(elapsed))"

# ---- 4. GPU benchmark ------------------------------------------------------------------
PYTHON="$py" bench/run_gpu_benchmarks.sh "$build" || failures+=("the GPU benchmarks (make bench-gpu)")
# The planner's GPU profile (docs/guides/planner.md): the costs it measures.
PYTHONPATH="bindings/python${PYTHONPATH:+:$PYTHONPATH}" DSOPT_LIBRARY_DIR="$build" \
  "$py" -m dsopt.plan --calibrate --calibrate-device cuda --profile "$build/plan-profile-gpu.json" ||
  failures+=("the planner's GPU calibration")

echo "test-gpu: finished in $(elapsed)"
if [ ${#failures[@]} -gt 0 ]; then
  echo "test-gpu: FAILED: ${failures[*]}" >&2
  exit 1
fi
echo "test-gpu: every part passed"
