#!/usr/bin/env bash
# `make test-sanitize`: the C tests under the sanitizers, in build trees of
# their own (CUDA off, -O1 -g, GCC: its libasan/libubsan/libtsan come with
# g++, so CI installs nothing more):
#
#   1. <asan-build>: AddressSanitizer + UndefinedBehaviorSanitizer
#      (+ float-cast-overflow, + libstdc++'s bounds assertions), every CTest
#      test of the build (tests/c, tests/internal, the examples' smoke test,
#      the mpirun -np 2/3/4 runs included) with LeakSanitizer on. Any report
#      fails the test it happens in. Then dsopt.torch's tests of parameters
#      moved or cast after the optimizer exists, over that library
#      (run_torch_asan.sh; skips without a Python with torch).
#   2. <tsan-build>: ThreadSanitizer, test_threads_many_handles (threads
#      with their own handles of every optimizer kind, concurrently),
#      test_car_pieces (the compressed allreduce's thread pool) and
#      test_grad_ready (reductions on dsopt's own thread).
#
#   tests/sanitize/run_sanitizers.sh [--build-only] [asan-build [tsan-build]]
#   (defaults build-asan, build-tsan; JOBS = parallel compile jobs;
#    SAN_CC / SAN_CXX = compilers, default gcc / g++; --build-only builds
#    both trees and stops, as tests/prebuild.sh does: each build holds a
#    lock in its tree, so a second build of it waits for the first)
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build_only=
if [ "${1:-}" = --build-only ]; then build_only=yes; shift; fi
asan_build=${1:-build-asan}
tsan_build=${2:-build-tsan}
jobs=${JOBS:-$(nproc)}
cc=${SAN_CC:-gcc}
cxx=${SAN_CXX:-g++}
here="$root/tests/sanitize"

# RelWithDebInfo with -O1 instead of -O2 (and without -DNDEBUG): line-exact
# reports, asserts on, a fraction of -O0's run time.
common=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g"
        -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx"
        -DDSOPT_WITH_CUDA=OFF -DDSOPT_BUILD_BENCH=OFF
        -DBUILD_TESTING=ON -DDSOPT_BUILD_TESTS=ON -DDSOPT_BUILD_EXAMPLES=ON)

configure_and_build() { # <dir> <compile flags> [cmake --build args...]
  local dir=$1 flags=$2 lock
  shift 2
  mkdir -p "$dir"
  exec {lock}>"$dir/.build-lock"
  flock "$lock"
  cmake -S . -B "$dir" "${common[@]}" \
    "-DCMAKE_C_FLAGS=$flags" "-DCMAKE_CXX_FLAGS=$flags" \
    "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags" >/dev/null
  cmake --build "$dir" -j"$jobs" "$@"
  exec {lock}>&-
}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ---- 1. ASan + UBSan + LSan ---------------------------------------------------
# -fno-sanitize-recover: the first UB report ends the process (a failed
# test), not a line in a log nobody reads. float-cast-overflow (a float out
# of an integer type's range converted to it) is UB that GCC's
# -fsanitize=undefined leaves out. _GLIBCXX_ASSERTIONS: std::vector and
# friends check their indices (same ABI); _GLIBCXX_SANITIZE_VECTOR: ASan also
# sees accesses between a vector's size and its capacity.
asan_flags="-fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer"
asan_flags+=" -fno-sanitize-recover=undefined,float-cast-overflow"
asan_flags+=" -D_GLIBCXX_ASSERTIONS -D_GLIBCXX_SANITIZE_VECTOR"
echo "== sanitize: ASan + UBSan + LSan build in $asan_build"
configure_and_build "$asan_build" "$asan_flags"
# See keep_dlopened.c: Open MPI's plugins stay mapped until exit, so the
# leak reports name them and lsan.supp can match Open MPI's own leaks.
"$cc" -shared -fPIC -O1 -o "$asan_build/keep_dlopened.so" "$here/keep_dlopened.c"
# The TSan tree: only the three tests of part 2.
echo "== sanitize: ThreadSanitizer build in $tsan_build"
configure_and_build "$tsan_build" "-fsanitize=thread -fno-omit-frame-pointer" \
  --target test_threads_many_handles test_car_pieces test_grad_ready
[ -n "$build_only" ] && exit 0

# The ranks inherit this environment from mpirun (one node: Open MPI passes
# its whole environment to the processes it starts; across nodes it would
# take `mpirun -x LD_PRELOAD -x ASAN_OPTIONS ...`). Every process ctest
# starts gets the preload, mpirun and the compilers of the header tests
# too: a no-op dlclose changes nothing for them.
#   verify_asan_link_order=0: the preloaded library comes before libasan in
#     the load order; it calls nothing at load time, so that is safe.
#   fast_unwind_on_malloc=0: Open MPI, PMIx and libevent are built without
#     frame pointers; the frame-pointer unwinder stops in their first frame,
#     before ompi_mpi_init/event_base_loop, which lsan.supp matches. The
#     DWARF unwinder walks the whole stack (slower mallocs; the suite stays
#     well under a minute).
#   detect_stack_use_after_return, check_initialization_order,
#   strict_init_order, strict_string_checks: the checks ASan leaves off by
#     default.
asan_options=detect_leaks=1:abort_on_error=1:halt_on_error=1:verify_asan_link_order=0
asan_options+=:fast_unwind_on_malloc=0:detect_stack_use_after_return=1
asan_options+=:check_initialization_order=1:strict_init_order=1:strict_string_checks=1
echo "== sanitize: CTest under ASan + UBSan + LSan ($asan_build)"
(cd "$asan_build" &&
  LD_PRELOAD="$root/$asan_build/keep_dlopened.so" \
  ASAN_OPTIONS=$asan_options \
  LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure --timeout 600)
echo "== sanitize: dsopt.torch with moved parameters over $asan_build"
"$here/run_torch_asan.sh" "$asan_build"

# ---- 2. TSan ------------------------------------------------------------------
# Only the threads test: the MPI tests have one thread per rank, and the
# other tests run one handle at a time.
# OpenMP: GCC's libgomp is not built with -fsanitize=thread, so TSan cannot
# see the synchronisation of its barriers and reports every hand-over
# between the threads of one OpenMP team (the kernels' fixed ranges, written
# by one thread, read by the next region's) as a race; there are hundreds of
# such false reports per run. DSOPT_TEST_KERNEL_THREADS=1 makes the test
# pass "threads": 1, so each handle's kernels run on the calling thread and
# every thread TSan watches is one the test started; no suppressions needed.
# (The OpenMP teams themselves are covered by the normal run of the test,
# with 2 threads per handle, and by the ASan run.)
echo "== sanitize: test_threads_many_handles under TSan ($tsan_build)"
(cd "$tsan_build" &&
  DSOPT_TEST_KERNEL_THREADS=1 \
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --output-on-failure --timeout 600 -R '^test_threads_many_handles$')

# The compressed allreduce's thread pool (cpu_car.cpp): its pieces on 1, 2
# and 3 threads against 1, two ranks (tsan.supp as below).
echo "== sanitize: test_car_pieces (2 ranks, the compressed allreduce's pool) under TSan ($tsan_build)"
(cd "$tsan_build" &&
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp" \
  mpirun -np 2 --oversubscribe tests/internal/test_car_pieces)

# dsopt_grad_ready's reductions on dsopt's own thread (CommRunner) while the
# caller's thread packs the next buckets: two ranks under MPI_THREAD_MULTIPLE.
# tsan.supp silences one lock-order report inside Open MPI's own start-up
# (mca_btl_tcp_add_procs), which is not dsopt's.
echo "== sanitize: test_grad_ready (2 ranks, MPI_THREAD_MULTIPLE) under TSan ($tsan_build)"
(cd "$tsan_build" &&
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$here/tsan.supp" \
  mpirun -np 2 --oversubscribe tests/test_grad_ready multiple)
