#!/usr/bin/env bash
# `make test-fuzz`: builds the libFuzzer targets (tests/fuzz) into BUILD
# (default build-fuzz: clang, CUDA and MPI off, ASan + UBSan) and runs each for
# FUZZ_SECONDS (default 40) on a temporary copy of its checked-in corpus, so
# the repository is not modified; the targets run side by side, FUZZ_JOBS
# (default: the number of cores) at a time, each fuzzer being one process.
# Fails on any crash, leak, sanitizer report or property violation; the
# input is kept in BUILD/fuzz-artifacts/. Skips (exit 0, with a message)
# when clang, libFuzzer or clang's OpenMP runtime is missing. --build-only
# builds the targets and stops (tests/prebuild.sh); the build holds a lock
# in BUILD, so a second build of the tree waits for the first.
#   tests/fuzz/run_fuzz.sh [--build-only] [BUILD]   FUZZ_SECONDS=600 for a longer run
set -euo pipefail
cd "$(dirname "$0")/../.."
build_only=
if [ "${1:-}" = --build-only ]; then build_only=yes; shift; fi
BUILD=${1:-build-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-40}
CC=${FUZZ_CC:-clang}
CXX=${FUZZ_CXX:-clang++}

skip() {
  echo "test-fuzz: SKIPPED: $* (apt-get install clang libomp-dev)" >&2
  exit 0
}
command -v "$CXX" >/dev/null 2>&1 || skip "no $CXX on PATH"
command -v "$CC" >/dev/null 2>&1 || skip "no $CC on PATH"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/probe.cpp" <<'PROBE'
#include <omp.h>
#include <cstddef>
#include <cstdint>
extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return omp_get_max_threads() > 0 ? 0 : 1; }
PROBE
if ! "$CXX" -fsanitize=fuzzer,address,undefined -fopenmp "$tmp/probe.cpp" -o "$tmp/probe" 2> "$tmp/probe.err"; then
  skip "$CXX cannot link a libFuzzer target with ASan, UBSan and OpenMP: $(head -c 300 "$tmp/probe.err")"
fi

mkdir -p "$BUILD"
exec {lock}>"$BUILD/.build-lock"
flock "$lock"
cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSOPT_WITH_CUDA=OFF -DDSOPT_WITH_MPI=OFF \
  -DDSOPT_BUILD_TESTS=OFF -DDSOPT_BUILD_EXAMPLES=OFF -DDSOPT_BUILD_BENCH=OFF -DDSOPT_BUILD_FUZZ=ON
cmake --build "$BUILD" --target fuzz_state_load fuzz_config fuzz_block_codec -j"$(nproc)"
exec {lock}>&-
[ -n "$build_only" ] && exit 0

# fuzz <target>: one fuzzer on its corpus for SECONDS_EACH; its report goes
# to $tmp/<target>.out, whose "no crash" line is the only sign of success.
fuzz() {
  local t=$1 work="$tmp/$1"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp tests/fuzz/corpus/"$t"/* "$work/corpus/"
  local extra=(-timeout=30)
  [ "$t" = config ] && extra+=(-dict=tests/fuzz/config.dict)
  if "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_EACH" -print_final_stats=1 \
       -artifact_prefix="$work/artifacts/" "${extra[@]}" "$work/corpus" > "$work/log" 2>&1; then
    local runs rate
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log")
    echo "test-fuzz: fuzz_$t: ${runs} runs (${rate}/s), no crash"
  else
    tail -n 80 "$work/log"
    mkdir -p "$BUILD/fuzz-artifacts"
    cp "$work/artifacts/"* "$BUILD/fuzz-artifacts/" 2>/dev/null || true
    echo "test-fuzz: fuzz_$t FAILED; reproduce with: $BUILD/tests/fuzz/fuzz_$t $BUILD/fuzz-artifacts/<file>"
  fi
}

targets=(state_load config block_codec)
parallel=${FUZZ_JOBS:-$(nproc)}
echo "test-fuzz: ${targets[*]}, ${SECONDS_EACH} s each, $parallel at a time"
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do wait -n || true; done
  fuzz "$t" > "$tmp/$t.out" 2>&1 &
done
wait
status=0
for t in "${targets[@]}"; do
  cat "$tmp/$t.out"
  grep -q "^test-fuzz: fuzz_$t: .*, no crash$" "$tmp/$t.out" || status=1
done
exit $status
