// Scalar fp32 operations with one rounding each, never contracted or
// approximated: the "vector type" of one lane. The element math in this
// folder is written once against an Ops type; ScalarOps serves the CPU tail,
// the scalar CPU kernels and CUDA, the SIMD layers in src/kernels/cpu serve
// the vector loops.
#pragma once
#include <cmath>

#include "math/hd.hpp"

namespace dsopt {

DSOPT_ISA_BEGIN

struct ScalarOps {
  using F = float;
  DSOPT_HD static F set1(float x) { return x; }
#if defined(__CUDA_ARCH__)
  DSOPT_HD static F mul(F a, F b) { return __fmul_rn(a, b); }
  DSOPT_HD static F add(F a, F b) { return __fadd_rn(a, b); }
  DSOPT_HD static F div(F a, F b) { return __fdiv_rn(a, b); }
  DSOPT_HD static F sqrt(F a) { return __fsqrt_rn(a); }
  DSOPT_HD static F fma(F a, F b, F c) { return __fmaf_rn(a, b, c); }
#else
  // Built with -ffp-contract=off: a*b and a+b are never fused.
  DSOPT_HD static F mul(F a, F b) { return a * b; }
  DSOPT_HD static F add(F a, F b) { return a + b; }
  DSOPT_HD static F div(F a, F b) { return a / b; }
  DSOPT_HD static F sqrt(F a) { return __builtin_sqrtf(a); }
  DSOPT_HD static F fma(F a, F b, F c) { return __builtin_fmaf(a, b, c); }
#endif
  // x86 minps/maxps semantics (the second operand unless the comparison
  // holds), so every backend agrees; inputs here are finite.
  DSOPT_HD static F min(F a, F b) { return a < b ? a : b; }
  DSOPT_HD static F max(F a, F b) { return a > b ? a : b; }
};

DSOPT_ISA_END
}  // namespace dsopt
