// One lane: ScalarOps plus loads and stores of every dtype. Used for the
// tail of every vector loop and as the whole loop where no SIMD is usable.
#pragma once
#include <cstdint>

#include "math/half.hpp"
#include "math/scalar_ops.hpp"

namespace dsopt {

DSOPT_ISA_BEGIN

struct VecScalar : ScalarOps {
  static constexpr int W = 1;
  static const char* name() { return "scalar"; }
  static F load(const float* p) { return *p; }
  static void store(float* p, F x) { *p = x; }
  static F load_f16(const uint16_t* p) { return f16_to_float(*p); }
  static void store_f16(uint16_t* p, F x) { *p = float_to_f16(x); }
  static F load_bf16(const uint16_t* p) { return bf16_to_float(*p); }
  static void store_bf16(uint16_t* p, F x) { *p = float_to_bf16(x); }
  static bool any_nan(F x) { return x != x; }
  // acc[0] += double(x)^2 (exact square, one rounding in the addition).
  static void add_squares(double* acc, F x) { acc[0] += double(x) * double(x); }
  // Bit i set iff !(lane i < 0) (so +0, -0 and NaN count as non-negative).
  static uint32_t nonneg_mask(F x) { return (x < 0.0f) ? 0u : 1u; }
  // Lane i: a where bit i of mask is set, else b.
  static F select(uint32_t mask, F a, F b) { return (mask & 1u) ? a : b; }
};

DSOPT_ISA_END
}  // namespace dsopt
