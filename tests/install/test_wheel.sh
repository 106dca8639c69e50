#!/usr/bin/env bash
# The Python package as a user installs it: `pip wheel` from a copy of the
# repository (its tracked files), the copy deleted, the wheel installed into a
# fresh venv that takes PyPI torch from another path (the framework venv's
# site-packages, scripts/framework_venv.sh, through a .pth file), then, from
# an unrelated directory: the package is self-contained (libdsopt and its MPI
# plugin next to the extension, nothing pointing back at the copy),
# `python -m dsopt` reports them, MPI works through the wheel's plugin
# (2 ranks under mpirun), and dsopt.torch trains a small torch model.
# Needs pip access to PyPI (scikit-build-core, cffi, numpy). CUDA is left
# out of the build to keep it short (CMAKE_ARGS; on by default when nvcc is
# found).
#   tests/install/test_wheel.sh
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "test_wheel: FAILED: $*" >&2; exit 1; }

echo "== pip wheel from a copy of the repository"
mkdir "$work/src"
(cd "$repo" && git ls-files -z | xargs -0 cp --parents -t "$work/src")
start=$(date +%s)
CMAKE_ARGS="-DDSOPT_WITH_CUDA=OFF" python3 -m pip wheel -q --no-deps --disable-pip-version-check \
  -w "$work/dist" "$work/src" >/dev/null || fail "pip wheel"
wheel=$(ls "$work"/dist/dsopt-*.whl)
echo "built $(basename "$wheel") in $(( $(date +%s) - start )) s"
rm -rf "$work/src"

echo "== a fresh venv, PyPI torch from another path"
python3 -m venv "$work/venv"
py=$work/venv/bin/python
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
torch_py=""
if fw=$("$repo/scripts/framework_venv.sh" 2>/dev/null); then
  torch_site=$("$fw" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  [ "$("$fw" -c 'import sys; print(sys.version_info[:2])')" = "$("$py" -c 'import sys; print(sys.version_info[:2])')" ] &&
    echo "$torch_site" > "$site/framework_venv.pth" && torch_py=yes
fi
"$py" -m pip install -q --disable-pip-version-check "$wheel" >/dev/null || fail "pip install the wheel"
cd "$work"

echo "== python -m dsopt"
"$py" -m dsopt | tee "$work/info.txt"
grep -q "libdsopt:   $site/dsopt/libdsopt.so" "$work/info.txt" || fail "libdsopt is not the package's own"
grep -q "MPI:        Open MPI" "$work/info.txt" || fail "MPI through the wheel's plugin"
for f in "$site"/dsopt/*.so*; do
  if readelf -d "$f" | grep -E 'R(UN)?PATH' | grep -q "$work/src"; then fail "$f points at the deleted copy"; fi
done

echo "== MPI, 2 ranks"
cat > "$work/mpi_ranks.py" <<'PY'
import ctypes, ctypes.util, sys
import numpy as np
libmpi = ctypes.CDLL(ctypes.util.find_library("mpi") or "libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
libmpi.MPI_Init(None, None)
world = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(libmpi, "ompi_mpi_comm_world")))
libmpi.MPI_Comm_c2f.restype = ctypes.c_int
libmpi.MPI_Comm_c2f.argtypes = [ctypes.c_void_p]
import dsopt
rank = ctypes.c_int()
libmpi.MPI_Comm_rank(world, ctypes.byref(rank))
params = [np.ones(1000, np.float32)]
with dsopt.Communicator.from_fortran_handle(libmpi.MPI_Comm_c2f(world)) as comm, \
     dsopt.Optimizer({"optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}, params, comm=comm) as opt:
    opt.step([np.full(1000, float(rank.value + 1), np.float32)])
# One file per rank: mpirun may interleave the ranks' stdout mid-line.
with open(f"{sys.argv[1]}/rank{rank.value}.txt", "w") as out:
    out.write(f"rank {rank.value}: {params[0][0]:.6f}\n")
libmpi.MPI_Finalize()
PY
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe "$py" "$work/mpi_ranks.py" "$work"
cat "$work/rank0.txt" "$work/rank1.txt" | tee "$work/ranks.txt"
[ "$(awk '{print $3}' "$work/ranks.txt" | sort -u | wc -l)" = 1 ] || fail "the ranks differ"
grep -q "rank 1: 0.9" "$work/ranks.txt" || fail "unexpected parameters"

if [ -n "$torch_py" ]; then
  echo "== dsopt.torch with PyPI torch"
  "$py" - <<'PY'
import torch, dsopt, dsopt.torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
x, y = torch.randn(256, 16), torch.randn(256, 1)
opt = dsopt.torch.AdamW(model.parameters(), lr=1e-2)
losses = []
for _ in range(50):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(f"torch {torch.__version__}, dsopt from {dsopt.__file__}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
assert losses[-1] < 0.8 * losses[0], losses
PY
else
  echo "== dsopt.torch: skipped (no framework venv of this Python version: scripts/framework_venv.sh)"
fi
echo "test_wheel: passed"
