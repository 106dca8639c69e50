#!/usr/bin/env bash
# The dsopt demo: trains examples/c/train_logreg.c (softmax regression with
# AdamW) on 1 process, then on 4 MPI ranks.
#   examples/run_demo.sh <builddir>
# DSOPT_DEMO_STEPS=N in the environment shortens or lengthens the runs.
set -euo pipefail

build=${1:?usage: run_demo.sh <builddir>}
bin=$build/examples
ranks=4

if [ ! -x "$bin/train_logreg" ]; then
  echo "run_demo: $bin/train_logreg is not built (cmake --build $build)" >&2
  exit 1
fi

echo "== train_logreg: 1 process, local communicator =="
"$bin/train_logreg"
echo

if ! command -v mpirun >/dev/null 2>&1; then
  echo "run_demo: mpirun not found, so only the 1-process run was done" \
       "(Debian: apt-get install openmpi-bin libopenmpi-dev, then rebuild)"
  exit 0
fi
if [ ! -x "$bin/train_logreg_mpi" ]; then
  echo "run_demo: $bin/train_logreg_mpi is not built (dsopt was configured without MPI)," \
       "so only the 1-process run was done"
  exit 0
fi

echo "== train_logreg_mpi: $ranks MPI ranks =="
launch=(mpirun -np "$ranks")
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  # More ranks than cores is fine here; Open MPI refuses it unless told.
  launch+=(--oversubscribe)
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
  for var in DSOPT_DEMO_STEPS OMP_NUM_THREADS LD_LIBRARY_PATH; do
    if [ -n "${!var:-}" ]; then launch+=(-x "$var"); fi
  done
fi
"${launch[@]}" "$bin/train_logreg_mpi"
