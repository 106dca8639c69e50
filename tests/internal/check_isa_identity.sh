#!/usr/bin/env bash
# The CPU kernels give the same bits with every instruction set this CPU has.
set -euo pipefail
probe="$1"
ref=$(DSOPT_CPU_ISA=scalar "$probe")
passed=0; failed=0
for isa in avx2 avx512; do
  got=$(DSOPT_CPU_ISA=$isa "$probe")
  if [ "$got" = "$ref" ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $isa gives $got, scalar $ref"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
