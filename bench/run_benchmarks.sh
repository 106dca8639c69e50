#!/usr/bin/env bash
# Runs the dsopt benchmarks (what `make bench` does), building them first.
#   bench/run_benchmarks.sh <builddir> [arguments for adam_cpu_bench]
# DSOPT_BENCH_THREADS sets the thread count (default 2: OpenMP threads of
# the reference loops and "threads" of the dsopt config alike).
set -euo pipefail

build=${1:?usage: run_benchmarks.sh <builddir> [adam_cpu_bench arguments]}
shift
threads=${DSOPT_BENCH_THREADS:-2}
benchmarks=(adam_cpu_bench)

if ! log=$(cmake --build "$build" --target "${benchmarks[@]}" -j"$(nproc)" 2>&1); then
  echo "$log"
  echo "run_benchmarks: building ${benchmarks[*]} in $build failed" >&2
  exit 1
fi

export OMP_NUM_THREADS=$threads

echo "== adam_cpu_bench: AdamW step throughput on the CPU =="
"$build/bench/adam_cpu_bench" --threads "$threads" "$@"
