#!/usr/bin/env bash
# The CPU kernels give the same bits with every instruction set this CPU has.
#   check_isa_identity.sh <probe> [launcher...]
# The launcher (e.g. "mpirun -np 3") runs multi-rank probes; DSOPT_CPU_ISA
# reaches every rank through the environment (Open MPI forwards it with -x).
set -euo pipefail
probe="$1"; shift
run() {
  if [ ${#launcher[@]} -gt 0 ]; then DSOPT_CPU_ISA=$1 "${launcher[@]}" -x DSOPT_CPU_ISA "$probe"; else DSOPT_CPU_ISA=$1 "$probe"; fi
}
launcher=("$@")
ref=$(run scalar)
passed=0; failed=0
for isa in avx2 avx512; do
  got=$(run $isa)
  if [ "$got" = "$ref" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $isa gives $got, scalar $ref"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
