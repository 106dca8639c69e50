#!/usr/bin/env bash
# The main demo (demo.py): a digits MLP trained with AdamW, 1-bit Adam and
# 1-bit Adam with "stabilize": false, data-parallel on 4 MPI ranks (one
# process when mpirun or mpi4py is missing).
#   examples/python/run_demo.sh [output dir] [demo.py arguments]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-out/demo}; shift || true
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1  # 4 ranks share the cores
if command -v mpirun >/dev/null && python3 -c "import mpi4py" 2>/dev/null; then
  flags=(-np 4)
  mpirun --version 2>/dev/null | grep -q "Open MPI" && flags+=(--oversubscribe)
  exec mpirun "${flags[@]}" python3 "$here/demo.py" --out "$out" "$@"
fi
echo "mpirun or mpi4py not found: running on one process with the local communicator"
exec python3 "$here/demo.py" --out "$out" "$@"
