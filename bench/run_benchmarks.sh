#!/usr/bin/env bash
# Runs the dsopt benchmarks (what `make bench` does), building them first.
#   bench/run_benchmarks.sh <builddir> [arguments for adam_cpu_bench]
# DSOPT_BENCH_THREADS sets the thread count of adam_cpu_bench and
# adam_cpu_peers.py (default 2: OpenMP threads of the reference loops, torch
# and DeepSpeed, and "threads" of the dsopt config alike); DSOPT_BENCH_PYTHON
# the interpreter of adam_cpu_peers.py (default python3). The MPI benchmarks
# run 4 ranks of 1 thread each ("threads": 1, OMP_NUM_THREADS=1: the tuned
# runs); the compressed allreduce and 1-bit Adam runs are repeated with the
# default config (no "threads", OMP_NUM_THREADS unset: what a new user's
# mpirun gets), the rows marked "default config".
# DSOPT_BENCH_NETEM=0 leaves out the runs on the emulated 1 Gbit/s link
# (bench/netem.sh; they need root and take about 43 minutes, the 0/1 Adam,
# ZeRO, compressed ZeRO and overlap runs included).
# DSOPT_BENCH_LAMB=1 adds the 1-bit LAMB training run on that link (about
# 12 more minutes).
# bench/time_to_quality.py (a GPT trained with AdamW and the 1-bit
# optimizers on that link, about 10 minutes) runs under the first Python
# that has torch, mpi4py and the dsopt binding: DSOPT_BENCH_TORCH_PYTHON,
# else the framework venv's (scripts/framework_venv.sh; used when it exists,
# mpi4py added to it), python3, /usr/bin/python3; its JSON goes to
# DSOPT_BENCH_TTQ_OUT (default <builddir>/bench/time_to_quality).
# DSOPT_BENCH_TTQ=0 leaves it out.
# examples/python/compressed_zero_study.py (compressed ZeRO's final loss on
# the digits MLP and the GPT, every codec pair, 3 seeds at 4 ranks, about 2
# minutes) runs under the same Python; its JSON goes to
# DSOPT_BENCH_STUDY_OUT (default <builddir>/bench/compressed_zero_study.json;
# runs already there are not run again). DSOPT_BENCH_STUDY=0 leaves it out.
set -euo pipefail

build=${1:?usage: run_benchmarks.sh <builddir> [adam_cpu_bench arguments]}
shift
here=$(cd "$(dirname "$0")" && pwd)
threads=${DSOPT_BENCH_THREADS:-2}
ranks=4

build_targets() {
  local log
  if ! log=$(cmake --build "$build" --target "$@" -j"$(nproc)" 2>&1); then
    echo "$log"
    echo "run_benchmarks: building $* in $build failed" >&2
    exit 1
  fi
}

# adam_cpu_bench is always there; building it also refreshes the build's
# list of benchmarks (bench/benchmarks.txt, written when CMake configures).
build_targets adam_cpu_bench
mpi_benchmarks=()
for name in compressed_allreduce_bench onebit_e2e_bench zero_e2e_bench compressed_zero_bench overlap_e2e_bench; do
  if grep -qx "$name" "$build/bench/benchmarks.txt" 2>/dev/null; then mpi_benchmarks+=("$name"); fi
done
if [ ${#mpi_benchmarks[@]} -gt 0 ]; then build_targets "${mpi_benchmarks[@]}"; fi

echo "== adam_cpu_bench: AdamW step throughput on the CPU =="
OMP_NUM_THREADS=$threads "$build/bench/adam_cpu_bench" --threads "$threads" "$@"

build_targets divergence_check_cost
echo
echo "== divergence_check_cost: the divergence check's cost in a CPU AdamW step =="
OMP_NUM_THREADS=$threads "$build/bench/divergence_check_cost" --threads "$threads"
echo "-- the same on 10,000 tensors of 1,000 (the pass reads several small tensors side by side)"
OMP_NUM_THREADS=$threads "$build/bench/divergence_check_cost" --threads "$threads" \
  --numel 10000000 --tensors 10000 --iters 40

# dsopt against torch's and DeepSpeed's CPU AdamW in one Python process.
# DSOPT_BENCH_PYTHON names the interpreter (one with torch, and DeepSpeed if
# it is to be compared; a missing contender is skipped with a message); the
# dsopt binding must be built (`make bench` builds it).
build_targets dsopt_bench_probe
python=${DSOPT_BENCH_PYTHON:-python3}
with_build() {
  LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$here/../bindings/python" "$@"
}
echo
echo "== adam_cpu_peers.py: dsopt's CPU AdamW against torch and DeepSpeed, one process =="
if with_build "$python" -c "import dsopt" 2>/dev/null; then
  OMP_NUM_THREADS=$threads DSOPT_BENCH_THREADS=$threads with_build "$python" "$here/adam_cpu_peers.py" \
    --probe-lib "$build/bench/libdsopt_bench_probe.so"
else
  echo "run_benchmarks: adam_cpu_peers.py skipped ($python cannot import the dsopt binding; make python)"
fi

# The CUDA benchmark is in builds with CUDA; without a device it says so.
if grep -qx adam_cuda_bench "$build/bench/benchmarks.txt" 2>/dev/null; then
  build_targets adam_cuda_bench
  echo
  echo "== adam_cuda_bench: AdamW and 1-bit Adam step throughput on a CUDA device =="
  "$build/bench/adam_cuda_bench"
  if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo
    echo "== torch's CUDA AdamW (fused and foreach), same sizes =="
    python3 "$here/adam_cuda_torch.py"
  fi
fi

if [ ${#mpi_benchmarks[@]} -eq 0 ]; then
  echo
  echo "run_benchmarks: compressed_allreduce_bench, onebit_e2e_bench, zero_e2e_bench, compressed_zero_bench and overlap_e2e_bench skipped" \
       "(dsopt built without MPI)"
  exit 0
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo
  echo "run_benchmarks: compressed_allreduce_bench, onebit_e2e_bench, zero_e2e_bench, compressed_zero_bench and overlap_e2e_bench" \
       "skipped (no mpirun; Debian: apt-get install openmpi-bin)"
  exit 0
fi

export OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

# Plain loopback: the ranks talk TCP over lo with no rate limit. As root in
# a private network namespace (so that lo carries nothing else and its byte
# counter is exact), otherwise on the machine's own lo.
loopback() {
  local status=0
  if [ "$(id -u)" = 0 ]; then
    DSOPT_NETEM_RATE=none DSOPT_NETEM_NP=$ranks "$here/netem.sh" "$@" || status=$?
    if [ $status -ne 77 ]; then return $status; fi
    echo "run_benchmarks: running on the machine's own loopback instead"
  fi
  local pass=(-x DSOPT_BENCH_NETWORK)
  if [ -n "${OMP_NUM_THREADS:-}" ]; then pass+=(-x OMP_NUM_THREADS); fi
  DSOPT_BENCH_NETWORK="the machine's loopback, no rate limit (lo byte counts include any other traffic on lo); TCP between ranks" \
    mpirun -np "$ranks" --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo \
    --mca oob_tcp_if_include lo "${pass[@]}" "$@"
}

# The same with the default config: no "threads" (--threads 0) and no
# OMP_NUM_THREADS, as a new user's mpirun runs it.
defaults() {
  (unset OMP_NUM_THREADS; "$@" --threads 0)
}

# The emulated link; exit status 77 from netem.sh means it could not run
# here (it says why), which is not a failure.
emulated() {
  local status=0
  if [ "${DSOPT_BENCH_NETEM:-1}" = 0 ]; then
    echo "run_benchmarks: skipped (DSOPT_BENCH_NETEM=0)"
    return 0
  fi
  # The output also goes to emulated.log, for the planner's comparison below.
  DSOPT_NETEM_RATE=${DSOPT_NETEM_RATE:-1gbit} DSOPT_NETEM_NP=$ranks "$here/netem.sh" "$@" |
    tee -a "$build/bench/emulated.log" || status=$?
  if [ $status -eq 77 ]; then return 0; fi
  return $status
}
: > "$build/bench/emulated.log"

for name in "${mpi_benchmarks[@]}"; do
  case $name in
    compressed_allreduce_bench)
      echo
      echo "== compressed_allreduce_bench: 1-bit compressed allreduce vs fp32, $ranks ranks, loopback =="
      loopback "$build/bench/compressed_allreduce_bench"
      echo
      echo "== compressed_allreduce_bench, default config: $ranks ranks, loopback =="
      defaults loopback "$build/bench/compressed_allreduce_bench"
      echo
      echo "== compressed_allreduce_bench: $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/compressed_allreduce_bench"
      echo
      echo "== compressed_allreduce_bench, default config: $ranks ranks on an emulated 1 Gbit/s link =="
      defaults emulated "$build/bench/compressed_allreduce_bench"
      ;;
    onebit_e2e_bench)
      echo
      echo "== onebit_e2e_bench: training steps, 1-bit Adam vs Adam, $ranks ranks, loopback (30 steps: step times only) =="
      loopback "$build/bench/onebit_e2e_bench" --steps 30 --freeze-step 6 --print-every 0
      echo
      echo "== onebit_e2e_bench, default config: 1-bit Adam vs Adam, $ranks ranks, loopback (30 steps: step times only) =="
      defaults loopback "$build/bench/onebit_e2e_bench" --steps 30 --freeze-step 6 --print-every 0
      echo
      echo "== onebit_e2e_bench: training, 1-bit Adam vs Adam, $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/onebit_e2e_bench"
      echo
      echo "== onebit_e2e_bench, default config: 1-bit Adam vs Adam, $ranks ranks on an emulated 1 Gbit/s link (30 steps: step times only) =="
      defaults emulated "$build/bench/onebit_e2e_bench" --steps 30 --freeze-step 6 --print-every 0
      if [ "${DSOPT_BENCH_LAMB:-0}" = 1 ]; then
        echo
        echo "== onebit_e2e_bench --lamb 1: 1-bit LAMB vs LAMB and Adam, $ranks ranks on an emulated 1 Gbit/s link =="
        emulated "$build/bench/onebit_e2e_bench" --lamb 1 --lamb-lr 0.1 --print-every 30
      fi
      echo
      echo "== onebit_e2e_bench: training, 0/1 Adam vs Adam, $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/onebit_e2e_bench" --onebit 0 --zoadam 1 --local-step-clipper 4
      ;;
    zero_e2e_bench)
      echo
      echo "== zero_e2e_bench: ZeRO-1/2 vs stage 0 AdamW, memory per rank (64M bf16) and step time (64M), $ranks ranks, loopback =="
      loopback "$build/bench/zero_e2e_bench"
      echo
      echo "== zero_e2e_bench: ZeRO-2 vs stage 0 AdamW step time (16M), $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/zero_e2e_bench" --mem-numel 0 --numel 16777216 --warmup 1 --steps 8
      echo
      echo "== zero_e2e_bench --lamb 1: ZeRO-1/2 vs stage 0 LAMB, memory per rank (64M bf16) and step time (64M), $ranks ranks, loopback =="
      loopback "$build/bench/zero_e2e_bench" --lamb 1
      echo
      echo "== zero_e2e_bench --lamb 1: ZeRO-2 vs stage 0 LAMB step time (16M), $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/zero_e2e_bench" --lamb 1 --mem-numel 0 --numel 16777216 --warmup 1 --steps 8
      ;;
    compressed_zero_bench)
      echo
      echo "== compressed_zero_bench: bytes and memory per rank of every codec pair against ZeRO-2 (4M), $ranks ranks, loopback =="
      loopback "$build/bench/compressed_zero_bench" --numel 0
      echo
      echo "== compressed_zero_bench: compressed vs uncompressed ZeRO-2 AdamW step time (16M), $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/compressed_zero_bench" --bytes-numel 0 --numel 16777216 --warmup 1 --steps 5
      ;;
    overlap_e2e_bench)
      echo
      echo "== overlap_e2e_bench: dsopt_grad_ready during backward vs dsopt_step at once, stage 0 and ZeRO-2, $ranks ranks, loopback =="
      loopback "$build/bench/overlap_e2e_bench"
      echo
      echo "== overlap_e2e_bench: dsopt_grad_ready during backward vs dsopt_step at once, $ranks ranks on an emulated 1 Gbit/s link =="
      emulated "$build/bench/overlap_e2e_bench"
      ;;
  esac
done

echo
echo "== dsopt.plan: predicted step times of the set-ups above on the emulated link, beside this run's and the recorded ones =="
# The planner calibrated on this machine now (1 thread per rank, as the runs
# above, with as many calibrations at once as the ranks keep cores busy;
# docs/guides/planner.md "Accuracy").
busy=$(( ranks < $(nproc) ? ranks : $(nproc) ))
if with_build "$python" -c "import dsopt" 2>/dev/null; then
  with_build "$python" -m dsopt.plan --calibrate --threads 1 --concurrent "$busy" \
    --profile "$build/bench/plan-profile.json" >/dev/null &&
    with_build "$python" -m dsopt.plan.benchmarks "$build/bench/plan-profile.json" --measured "$build/bench/emulated.log"
else
  echo "run_benchmarks: skipped ($python cannot import the dsopt binding; make python)"
fi

# A Python for time_to_quality.py: one with torch, mpi4py and the dsopt
# binding (see the top). Prints its path; fails when there is none.
torch_python() {
  local venv=${DSOPT_FRAMEWORK_VENV:-$HOME/.cache/dsopt/venv-frameworks}
  local candidates=()
  if [ -n "${DSOPT_BENCH_TORCH_PYTHON:-}" ]; then
    candidates=("$DSOPT_BENCH_TORCH_PYTHON")
  else
    if [ -x "$venv/bin/python" ]; then
      if ! "$venv/bin/python" -c "import mpi4py" 2>/dev/null; then
        echo "run_benchmarks: pip install mpi4py into $venv" >&2
        "$venv/bin/python" -m pip install -q --disable-pip-version-check mpi4py >&2 || true
      fi
      candidates+=("$venv/bin/python")
    fi
    candidates+=(python3 /usr/bin/python3)
  fi
  local py
  for py in "${candidates[@]}"; do
    command -v "$py" >/dev/null 2>&1 || continue
    if with_build "$py" -c "import torch, mpi4py, dsopt.torch" 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

echo
echo "== time_to_quality.py: a GPT to AdamW's validation loss, AdamW vs 1-bit Adam, 0/1 Adam, 1-bit LAMB, $ranks ranks on an emulated 1 Gbit/s link =="
if [ "${DSOPT_BENCH_TTQ:-1}" = 0 ]; then
  echo "run_benchmarks: skipped (DSOPT_BENCH_TTQ=0)"
elif [ "${DSOPT_BENCH_NETEM:-1}" = 0 ]; then
  echo "run_benchmarks: skipped (DSOPT_BENCH_NETEM=0)"
elif ! ttq_python=$(torch_python); then
  echo "run_benchmarks: time_to_quality.py skipped (no Python with torch, mpi4py and the dsopt binding;" \
       "set DSOPT_BENCH_TORCH_PYTHON)"
else
  with_build emulated "$ttq_python" "$here/time_to_quality.py" \
    --out "${DSOPT_BENCH_TTQ_OUT:-$build/bench/time_to_quality}"
fi

echo
echo "== compressed_zero_study.py: final loss of every codec pair against ZeRO-2 (digits MLP, GPT), $ranks ranks, 3 seeds =="
if [ "${DSOPT_BENCH_STUDY:-1}" = 0 ]; then
  echo "run_benchmarks: skipped (DSOPT_BENCH_STUDY=0)"
elif ! study_python=$(torch_python); then
  echo "run_benchmarks: compressed_zero_study.py skipped (no Python with torch, mpi4py and the dsopt binding;" \
       "set DSOPT_BENCH_TORCH_PYTHON)"
else
  with_build "$study_python" "$here/../examples/python/compressed_zero_study.py" --ranks "$ranks" \
    --results "${DSOPT_BENCH_STUDY_OUT:-$build/bench/compressed_zero_study.json}"
fi
