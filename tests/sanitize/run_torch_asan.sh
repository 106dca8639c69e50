#!/usr/bin/env bash
# dsopt.torch over an AddressSanitizer build of libdsopt: the tests of
# parameters moved or cast after the optimizer exists
# (tests/python/test_torch_param_moves.py, one process and mpirun -np 2),
# where a step that wrote storage a moved model left would be a
# heap-use-after-free report. run_sanitizers.sh calls it with its ASan
# build; it also runs alone against any build made with -fsanitize=address:
#
#   tests/sanitize/run_torch_asan.sh <asan-build>
#
# The Python is run_torch_tests.sh's (python3, else /usr/bin/python3, with
# torch and pytest), with the in-place cffi extension (`make python`): it
# has a RUNPATH, which LD_LIBRARY_PATH overrides, so it loads the ASan
# library; the script checks that it did. Skips (exit 0) without such a
# Python or extension.
#   LD_PRELOAD: torch and Python are not built with ASan, so libasan comes
#     first; libstdc++ right after it, because ASan's __cxa_throw
#     interceptor needs it loaded when the first C++ exception is thrown
#     (torch throws and catches its own).
#   detect_leaks=0: Python and torch keep allocations until exit.
set -euo pipefail

build=$(cd "${1:?usage: run_torch_asan.sh <asan-build>}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

py=
for candidate in python3 /usr/bin/python3; do
  command -v "$candidate" >/dev/null 2>&1 || continue
  if "$candidate" -c "import sys; sys.path.insert(0, 'bindings/python'); import torch, pytest, dsopt" \
      2>/dev/null; then
    py=$candidate
    break
  fi
done
if [ -z "$py" ]; then
  echo "torch-asan: SKIPPED: no Python with torch, pytest and the in-place cffi extension" \
       "(make python; see tests/python/run_torch_tests.sh)"
  exit 0
fi

cxx=${SAN_CXX:-g++}
asan=$("$cxx" -print-file-name=libasan.so)
stdcxx=$("$cxx" -print-file-name=libstdc++.so.6)
export LD_PRELOAD="$asan:$stdcxx"
export LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1:verify_asan_link_order=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$py" - "$build" <<'EOF'
import sys
sys.path.insert(0, "bindings/python")
import dsopt  # noqa: F401
maps = open("/proc/self/maps").read()
if sys.argv[1] + "/libdsopt" not in maps:
    sys.exit(f"torch-asan: the cffi extension did not load libdsopt from {sys.argv[1]}")
EOF
echo "torch-asan: $("$py" -c 'import sys, torch; print(sys.executable, "with torch", torch.__version__)'), libdsopt from $build"
# --capture=sys: an ASan report (written to file descriptor 2 before the
# process aborts) reaches the log instead of pytest's capture file.
exec "$py" -m pytest -q -rsx -p no:cacheprovider --capture=sys tests/python/test_torch_param_moves.py
