#!/bin/sh
# The shared library's ELF interface:
#   - SONAME is libdsopt.so.<MAJOR>;
#   - no load-time dependency on the CUDA driver (libcuda.so*), NCCL
#     (libnccl*) or MPI (libmpi*: the MPI communicator is the plugin
#     libdsopt_mpi, loaded on demand): the same library must load on
#     machines without them;
#   - it exports dsopt_* symbols only (the linker's own _init/_fini/_edata/
#     _end/__bss_start are tolerated), and every function dsopt.h declares.
# Usage: check_library_deps.sh <path/to/libdsopt.so> <MAJOR> <path/to/dsopt.h>
set -u
lib=$1
major=$2
header=$3
failures=0
passes=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { passes=$((passes + 1)); }

if [ ! -f "$lib" ]; then
  echo "FAIL: $lib does not exist"
  echo "0 passed, 1 failed"
  exit 1
fi

dynamic=$(readelf -d "$lib") || { echo "FAIL: readelf -d $lib"; echo "0 passed, 1 failed"; exit 1; }

soname=$(printf '%s\n' "$dynamic" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')
if [ "$soname" = "libdsopt.so.$major" ]; then pass; else fail "SONAME is '$soname', expected libdsopt.so.$major"; fi

needed=$(printf '%s\n' "$dynamic" | sed -n 's/.*(NEEDED).*\[\(.*\)\].*/\1/p')
echo "NEEDED: $(echo $needed)"
for forbidden in 'libcuda\.so' 'libnccl' 'libmpi'; do
  hit=$(printf '%s\n' "$needed" | grep -E "^$forbidden" || true)
  if [ -z "$hit" ]; then pass; else fail "depends on $hit at load time"; fi
done

# Defined dynamic symbols, without the version-node and linker symbols.
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" && $2 != "w" && $2 != "v" { print $3 }' | sed 's/@.*//' |
  grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' | sort -u)
others=$(printf '%s\n' "$exported" | grep -v '^dsopt_' || true)
if [ -z "$others" ]; then pass; else fail "exports symbols outside dsopt_*: $(echo $others | cut -c1-400)"; fi

declared=$(grep -o 'DSOPT_API [^(;]*dsopt_[a-z0-9_]*(' "$header" | grep -o 'dsopt_[a-z0-9_]*($' | tr -d '(' | sort -u)
if [ -z "$declared" ]; then fail "found no DSOPT_API functions in $header"; fi
for name in $declared; do
  if printf '%s\n' "$exported" | grep -qx "$name"; then pass; else fail "$name is declared in dsopt.h but not exported"; fi
done

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
