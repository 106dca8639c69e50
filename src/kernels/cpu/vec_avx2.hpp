// AVX2 + FMA + F16C: 8 fp32 lanes. Compiled only into isa_avx2.cpp.
#pragma once
#include <immintrin.h>

#include "math/hd.hpp"

#include <cstdint>

namespace dsopt {

DSOPT_ISA_BEGIN

struct VecAvx2 {
  using F = __m256;
  static constexpr int W = 8;
  static const char* name() { return "avx2"; }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_f16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static F load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // Round to nearest even; a NaN keeps its sign and becomes quiet (math/half.hpp).
  static void store_bf16(uint16_t* p, F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  // acc[j] += double(x_j)^2 for the 8 lanes (the square is exact in double).
  static void add_squares(double* acc, F x) {
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    _mm256_storeu_pd(acc, _mm256_fmadd_pd(lo, lo, _mm256_loadu_pd(acc)));
    _mm256_storeu_pd(acc + 4, _mm256_fmadd_pd(hi, hi, _mm256_loadu_pd(acc + 4)));
  }
  static bool any_nan(F x) { return _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)) != 0; }
  static uint32_t nonneg_mask(F x) {
    return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_NLT_UQ)));
  }
  static F select(uint32_t mask, F a, F b) {
    const __m256i lanes = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(mask)), lanes), lanes);
    return _mm256_blendv_ps(b, a, _mm256_castsi256_ps(on));
  }
};

DSOPT_ISA_END
}  // namespace dsopt
