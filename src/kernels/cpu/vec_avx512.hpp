// AVX-512 (F, BW, VL) + F16C: 16 fp32 lanes. Compiled only into isa_avx512.cpp.
#pragma once
#include <immintrin.h>

#include "math/hd.hpp"

#include <cstdint>

namespace dsopt {

DSOPT_ISA_BEGIN

struct VecAvx512 {
  using F = __m512;
  static constexpr int W = 16;
  static const char* name() { return "avx512"; }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_f16(uint16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  // Round to nearest even; a NaN keeps its sign and becomes quiet (math/half.hpp).
  static void store_bf16(uint16_t* p, F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  // acc[j] += double(x_j)^2 for the 16 lanes (the square is exact in double).
  static void add_squares(double* acc, F x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    _mm512_storeu_pd(acc, _mm512_fmadd_pd(lo, lo, _mm512_loadu_pd(acc)));
    _mm512_storeu_pd(acc + 8, _mm512_fmadd_pd(hi, hi, _mm512_loadu_pd(acc + 8)));
  }
  static bool any_nan(F x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }
  static uint32_t nonneg_mask(F x) { return _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_NLT_UQ); }
  static F select(uint32_t mask, F a, F b) { return _mm512_mask_blend_ps(__mmask16(mask), b, a); }
};

DSOPT_ISA_END
}  // namespace dsopt
