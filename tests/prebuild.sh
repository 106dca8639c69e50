#!/usr/bin/env bash
# `make test` runs this first: it starts, in the background and at idle
# priority (SCHED_IDLE: it runs only on a core no other process wants), what
# the last test targets need and no earlier one does: the framework venv
# (scripts/framework_venv.sh, mostly a download, beside the builds), the
# fuzz targets' tree (tests/fuzz/run_fuzz.sh --build-only) and the
# sanitizers' trees (tests/sanitize/run_sanitizers.sh --build-only), one
# after the other. The tests before them leave a core idle much of the
# time (single-process Python, mpirun ranks waiting on each other), and
# the builds fill it, so those targets find their trees built. Each of
# those scripts holds a lock while it builds, so a target that arrives
# first builds (or waits for the build) itself, and a failed build here is
# only logged: the target builds again and reports.
# The background job stops between steps once <owner-pid> (the make that
# started it) has exited.
#   tests/prebuild.sh <owner-pid> <fuzz-build> <asan-build> <tsan-build>
#   log: build-prebuild/log
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

if [ "${1:-}" != --run ]; then
  [ $# -eq 4 ] || { echo "usage: tests/prebuild.sh <owner-pid> <fuzz-build> <asan-build> <tsan-build>" >&2; exit 2; }
  mkdir -p build-prebuild
  idle=(nice -n 19)
  chrt --idle 0 true 2>/dev/null && idle=(chrt --idle 0)
  "${idle[@]}" "$0" --run "$@" > build-prebuild/log 2>&1 < /dev/null &
  echo "prebuild: the framework venv, $2, $3 and $4 in the background at idle priority (log: build-prebuild/log)"
  exit 0
fi

owner=$2 fuzz_build=$3 asan_build=$4 tsan_build=$5
step() {
  kill -0 "$owner" 2>/dev/null || { echo "prebuild: make exited; stopping"; exit 0; }
  echo "prebuild: $* ($(date +%T))"
  "$@" || echo "prebuild: $* failed; the test target that needs it builds it again"
}
# The venv (mostly waiting on the network) beside the builds.
step scripts/framework_venv.sh &
step tests/fuzz/run_fuzz.sh --build-only "$fuzz_build"
step tests/sanitize/run_sanitizers.sh --build-only "$asan_build" "$tsan_build"
wait
echo "prebuild: done ($(date +%T))"
