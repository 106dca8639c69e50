#!/usr/bin/env bash
# Runs tests/python/test_torch_optimizer.py, test_torch_overlap.py,
# test_torch_drop_in.py (dsopt.torch.Adam/AdamW/... against torch.optim),
# test_torch_param_moves.py (parameters moved or cast after the optimizer
# exists; 2 ranks under mpirun), test_torch_compile.py (torch >= 2.1),
# test_step_descriptor_cache.py (dsopt.torch, and torch tensors through
# dsopt.Optimizer), test_torch_comm.py (dsopt over torch.distributed,
# gloo ranks against mpirun), test_torch_optim_port.py (dsopt.torch.Adam
# and AdamW against torch.optim, PyTorch's own optimizer tests ported; 4
# ranks under mpirun), test_torch_divergence.py (dsopt.DivergenceWarning
# from dsopt.torch), test_transformer_models.py (the 1-bit optimizers
# against AdamW on a small GPT; 4 ranks under mpirun, and one) and
# test_agreed_errors.py (a sparse gradient or a bad hyperparameter on one rank),
# test_torch_lion.py (dsopt.torch.Lion against a float64 Lion in torch),
# test_torch_sgd.py (dsopt.torch.SGD, made from the registry, against torch.optim.SGD),
# test_torch_node_groups.py (the node-aware 1-bit optimizers over gloo: node
# and rail groups given with Communicator.set_nodes, or made by dsopt.torch),
# test_torch_prefetch.py (overlap=True under ZeRO: the deferred parameter
# allgather waited for by each module's forward; 1, 2 and 4 ranks),
# test_gloo_kill.py (gloo ranks killed or stopped mid-step) and
# test_cuda_torch.py, test_cuda_torch_dist.py (CUDA parameters; skip without
# a GPU) with a
# Python that has torch, numpy and pytest:
# python3, else /usr/bin/python3 (on Debian, apt-get install python3-torch
# python3-cffi python3-pytest; python3-sklearn and python3-mpi4py for
# test_torch_comm.py, which skips without them). The cffi
# extension is the in-place one when that Python can load it and it is
# newer than include/dsopt.h, else it is built for that Python against
# <builddir>. Skips when no Python has torch.
#   tests/python/run_torch_tests.sh <builddir>
set -euo pipefail

build=$(cd "${1:?usage: run_torch_tests.sh <builddir>}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

for py in python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  "$py" -c "import torch, numpy, pytest" 2>/dev/null || continue
  echo "test-torch: $("$py" -c 'import sys, torch; print(sys.executable, "with torch", torch.__version__)')"
  # Built again when that Python cannot load it, or when dsopt.h is newer
  # (an extension built before new calls were declared loads, but lacks them).
  ext=$(ls bindings/python/dsopt/_dsopt_cffi*.so 2>/dev/null | head -n1)
  if [ -z "$ext" ] || [ include/dsopt.h -nt "$ext" ] ||
     ! "$py" -c "import sys; sys.path.insert(0, 'bindings/python'); import dsopt" 2>/dev/null; then
    DSOPT_LIBRARY_DIR=$build "$py" bindings/python/dsopt/_ffi_build.py >/dev/null
  fi
  exec "$py" -m pytest -q -rsx tests/python/test_torch_optimizer.py tests/python/test_torch_overlap.py \
    tests/python/test_step_descriptor_cache.py tests/python/test_torch_comm.py \
    tests/python/test_torch_drop_in.py tests/python/test_torch_param_moves.py \
    tests/python/test_torch_compile.py tests/python/test_torch_optim_port.py \
    tests/python/test_torch_divergence.py tests/python/test_transformer_models.py \
    tests/python/test_agreed_errors.py tests/python/test_torch_lion.py tests/python/test_torch_sgd.py \
    tests/python/test_torch_prefetch.py tests/python/test_torch_node_groups.py \
    tests/python/test_gloo_kill.py \
    tests/python/test_cuda_torch.py tests/python/test_cuda_torch_dist.py
done
echo "test-torch: SKIPPED: no Python with torch, numpy and pytest (pip install torch;" \
     "or on Debian: apt-get install python3-torch python3-cffi python3-pytest python3-sklearn" \
     "python3-mpi4py for /usr/bin/python3)"
