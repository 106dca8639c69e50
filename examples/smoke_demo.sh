#!/usr/bin/env bash
# CTest smoke test of the demo: runs run_demo.sh and checks that every run
# ended with a final loss below 0.8 x its initial loss, and that the 4-rank
# run happened when it could.
#   examples/smoke_demo.sh <builddir>
set -uo pipefail

build=${1:?usage: smoke_demo.sh <builddir>}
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

export DSOPT_DEMO_STEPS=${DSOPT_DEMO_STEPS:-100}
"$here/run_demo.sh" "$build" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
if [ "$status" != 0 ]; then
  echo "smoke_demo: run_demo.sh failed with status $status"
  exit 1
fi

expected_runs=1
if command -v mpirun >/dev/null 2>&1 && [ -x "$build/examples/train_logreg_mpi" ]; then
  expected_runs=2
fi

# "final: steps S ranks R initial_loss A final_loss B ratio ..."
awk -v expected="$expected_runs" '
  /^final:/ {
    runs++
    for (i = 1; i < NF; i++) {
      if ($i == "ranks") ranks = $(i + 1)
      if ($i == "initial_loss") initial = $(i + 1) + 0
      if ($i == "final_loss") final = $(i + 1) + 0
    }
    ok = (initial > 0 && final < 0.8 * initial)
    printf "smoke_demo: %s ranks: loss %.4f -> %.4f (must be < %.4f): %s\n",
           ranks, initial, final, 0.8 * initial, ok ? "pass" : "FAIL"
    if (!ok) bad++
  }
  END {
    if (runs != expected) {
      printf "smoke_demo: expected %d runs, found %d final lines\n", expected, runs
      exit 1
    }
    exit bad ? 1 : 0
  }' "$out"
