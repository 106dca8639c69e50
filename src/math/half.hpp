// fp16 / bf16 <-> fp32 conversions on raw bits, round-to-nearest-even.
// The CPU vector code (F16C, integer ops) and the CUDA kernels produce the
// same bits as these functions, NaN included: a NaN keeps its sign and top
// payload bits and comes out quiet.
#pragma once
#include <cstdint>
#include <cstring>

#include "math/hd.hpp"

namespace dsopt {

DSOPT_ISA_BEGIN

DSOPT_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

DSOPT_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

DSOPT_HD float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

DSOPT_HD uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

DSOPT_HD float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1Fu)  // inf, or a NaN made quiet (as F16C and CUDA do)
    return bits_float(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u));
  if (exp == 0) {
    if (man == 0) return bits_float(sign);
    // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    man &= 0x3FFu;
    return bits_float(sign | uint32_t(127 - 15 - e) << 23 | (man << 13));
  }
  return bits_float(sign | (exp + (127 - 15)) << 23 | (man << 13));
}

DSOPT_HD uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // quiet NaN
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                  // below the smallest normal 2^-14
    if (a < 0x33000000u) return sign;                     // below half the smallest subnormal: 0
    uint32_t exp = a >> 23;
    uint32_t man = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 14 + (112 - exp) + ... : value = man * 2^(exp-150)
    // subnormal fp16 unit is 2^-24: result = man * 2^(exp-150+24) = man >> (126 - exp)
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);  // round mantissa to 10 bits, nearest even
  return uint16_t(sign | ((r - 0x38000000u) >> 13));
}

DSOPT_ISA_END
}  // namespace dsopt
