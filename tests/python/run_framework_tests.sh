#!/usr/bin/env bash
# The integration tests with the frameworks people train with, under PyPI's
# torch: dsopt.hf.Trainer (transformers), dsopt.lightning.DsoptStrategy
# (lightning), DistributedDataParallel with dsopt.torch.ddp_comm_hook, FSDP2
# with dsopt's codes as its collectives (dsopt.torch.fsdp), and
# dsopt.torch under torch.compile, with parameters moved or cast after
# the optimizer exists, with a sparse gradient or a bad hyperparameter on one rank, and
# with ZeRO's deferred allgather behind the forward, on FSDP2 models (fully_shard,
# HSDP, torch.distributed.checkpoint at 2 and 4 ranks; overlap's backward hooks need
# torch >= 2.1, so only here do gradients go over during backward as well,
# tests/python/test_torch_overlap.py's hook cases among them). Then `make
# test-gpu`'s Python suite (test_cuda_torch*.py) with the CPU standing in
# for the GPU (DSOPT_TEST_DEVICE=cpu): its lockstep, 2-rank and overlap code
# under the torch most GPU users run. The venv is scripts/framework_venv.sh's
# (created or completed first); the cffi extension is built for it against
# <builddir> when it cannot load the in-place one.
#   tests/python/run_framework_tests.sh <builddir> [pytest args]
set -euo pipefail

build=$(cd "${1:?usage: run_framework_tests.sh <builddir> [pytest args]}" && pwd)
shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

py=$(scripts/framework_venv.sh)
echo "test-frameworks: $("$py" -c 'import torch, transformers, lightning; print("torch", torch.__version__, "transformers", transformers.__version__, "lightning", lightning.__version__)')"
ext=$(ls bindings/python/dsopt/_dsopt_cffi*.so 2>/dev/null | head -n1)
if [ -z "$ext" ] || [ include/dsopt.h -nt "$ext" ] ||
   ! "$py" -c "import sys; sys.path.insert(0, 'bindings/python'); import dsopt" 2>/dev/null; then
  DSOPT_LIBRARY_DIR=$build "$py" bindings/python/dsopt/_ffi_build.py >/dev/null
fi
export DSOPT_LIBRARY_DIR=$build
"$py" -m pytest -q -rsx "$@" \
  tests/python/test_ddp_hook.py \
  tests/python/test_hf_trainer.py \
  tests/python/test_lightning_strategy.py \
  tests/python/test_torch_compile.py \
  tests/python/test_torch_param_moves.py \
  tests/python/test_torch_whole_checkpoint.py \
  tests/python/test_agreed_errors.py \
  tests/python/test_torch_prefetch.py \
  tests/python/test_torch_overlap.py \
  tests/python/test_fsdp_codes.py \
  tests/python/test_fsdp_plan.py \
  tests/python/test_fsdp2.py
DSOPT_TEST_DEVICE=cpu "$py" -m pytest -q -rsx "$@" \
  tests/python/test_cuda_torch.py \
  tests/python/test_cuda_torch_dist.py
