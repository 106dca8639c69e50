// The portable fp16/bf16 conversions (src/math/half.hpp) against the CPU's
// F16C instructions and an independent bf16 rounding written here in
// integer arithmetic: every fp16 value, and fp32 values across every
// exponent (including the subnormal and overflow boundaries).
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "math/half.hpp"

namespace {

int failures = 0, passes = 0;

void expect(bool ok, const char* what, uint32_t input, uint32_t got, uint32_t want) {
  if (ok) {
    ++passes;
    return;
  }
  if (++failures <= 10) std::printf("FAIL %s: input 0x%08x got 0x%08x want 0x%08x\n", what, input, got, want);
}

__attribute__((target("f16c"))) uint16_t f16c_from_float(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) float f16c_to_float(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

// bf16 by exact arithmetic: the two neighbours and a tie-to-even choice.
uint16_t bf16_reference(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  const uint32_t down = u & 0xFFFF0000u, rem = u & 0xFFFFu;
  if (rem < 0x8000u) return uint16_t(down >> 16);
  if (rem > 0x8000u) return uint16_t((down >> 16) + 1);
  return uint16_t((down >> 16) + ((down >> 16) & 1));
}

void check_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  const uint16_t got = dsopt::float_to_f16(f), want = f16c_from_float(f);
  expect(got == want, "float_to_f16", u, got, want);
  const uint16_t gotb = dsopt::float_to_bf16(f), wantb = bf16_reference(u);
  expect(gotb == wantb, "float_to_bf16", u, gotb, wantb);
}

}  // namespace

int main() {
  if (!__builtin_cpu_supports("f16c")) {
    std::printf("SKIPPED: this CPU has no F16C to compare with\n");
    return 0;
  }
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float got = dsopt::f16_to_float(uint16_t(h)), want = f16c_to_float(uint16_t(h));
    uint32_t g, w;
    std::memcpy(&g, &got, 4);
    std::memcpy(&w, &want, 4);
    expect(g == w, "f16_to_float", h, g, w);
    const float b = dsopt::bf16_to_float(uint16_t(h));
    std::memcpy(&g, &b, 4);
    expect(g == (h << 16), "bf16_to_float", h, g, h << 16);
  }
  // Every exponent, both signs, a spread of mantissas including the
  // rounding boundaries (...0fff, ...1000, ...1001 and the bf16 ones).
  const uint32_t mantissas[] = {0x000000, 0x000001, 0x000fff, 0x001000, 0x001001, 0x002000,
                                0x003000, 0x007fff, 0x008000, 0x008001, 0x018000, 0x3fffff,
                                0x400000, 0x7fefff, 0x7ff000, 0x7ff001, 0x7fffff};
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t m : mantissas) check_float(sign << 31 | e << 23 | m);
      for (uint32_t m = 0; m < (1u << 23); m += 4099) check_float(sign << 31 | e << 23 | m);
    }
  std::printf("%d passed, %d failed\n", passes, failures);
  return failures ? 1 : 0;
}
