// Streaming probes: Adam's memory traffic with next to no arithmetic.
#include <cstring>

#include "baselines.hpp"

namespace bench {

void probe_f32(float* p, const float* g, float* m, float* v, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * 0.5f + gi;
    const float vi = v[i] * 0.25f + gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + (mi - vi) * 1e-6f;
  }
}

void probe_16(float* master, const uint16_t* g16, float* m, float* v, uint16_t* p16, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t gbits = uint32_t(g16[i]) << 16;  // bfloat16 -> fp32 is a shift
    float gi;
    std::memcpy(&gi, &gbits, 4);
    const float mi = m[i] * 0.5f + gi;
    const float vi = v[i] * 0.25f + gi;
    m[i] = mi;
    v[i] = vi;
    const float pi = master[i] + (mi - vi) * 1e-6f;
    master[i] = pi;
    uint32_t pbits;
    std::memcpy(&pbits, &pi, 4);
    p16[i] = uint16_t(pbits >> 16);
  }
}

}  // namespace bench
