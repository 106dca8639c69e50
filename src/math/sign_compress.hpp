// Element rules of the 1-bit compressed allreduce (docs/design/compressed-allreduce.md
// section 3, decisions.md C2-C4), shared by the CPU and CUDA kernels.
#pragma once
#include <cstdint>

#include "math/hd.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

// The sign bit: 1 iff !(v < 0), so +0, -0 and NaN count as +1.
DSOPT_HD uint32_t sign_bit(float v) { return (v < 0.0f) ? 0u : 1u; }

// e = v - s * sign(v); s * (+/-1) is exact, so this is one rounding.
DSOPT_HD float sign_error(float v, float s) { return (v < 0.0f) ? v + s : v - s; }

// Bit k of a chunk: byte k / 8, bit 7 - k % 8 (MSB first).
DSOPT_HD bool chunk_bit(const uint8_t* bytes, int64_t k) {
  return (bytes[k >> 3] >> (7 - (k & 7))) & 1u;
}

DSOPT_ISA_END
}  // namespace dsopt
