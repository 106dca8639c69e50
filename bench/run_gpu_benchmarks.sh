#!/usr/bin/env bash
# `make bench-gpu`: the GPU benchmarks, in under 2 minutes on a machine with
# an NVIDIA GPU once the build exists: bench/adam_cuda.cu (dsopt's CUDA
# steps against a device-to-device copy of the bytes they move) and
# bench/adam_cuda_torch.py (torch's fused and foreach AdamW on the same
# sizes), one after the other on the same GPU. Builds adam_cuda_bench in
# BUILD_DIR for the GPU it finds (that architecture only) where it is
# missing or out of date.
#   bench/run_gpu_benchmarks.sh [BUILD_DIR]   (default build-gpu)
set -euo pipefail

build=${1:-build-gpu}
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
command -v nvcc >/dev/null 2>&1 || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH="$PATH:/usr/local/cuda/bin"
if ! gpu=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -n1) ||
   [ -z "$gpu" ]; then
  echo "bench-gpu: no NVIDIA GPU here (nvidia-smi found none)" >&2
  exit 1
fi
arch=$(echo "$gpu" | sed 's/.*, *//' | tr -d '. ')
echo "bench-gpu: $gpu"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDSOPT_BUILD_BENCH=ON -DDSOPT_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" >/dev/null
fi
cmake --build "$build" -j"$(nproc)" --target adam_cuda_bench >"$build/bench-gpu-build.log" 2>&1 ||
  { tail -n 40 "$build/bench-gpu-build.log"; echo "bench-gpu: build failed" >&2; exit 1; }
"$build/bench/adam_cuda_bench"
"$py" bench/adam_cuda_torch.py
