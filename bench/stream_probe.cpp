// Streaming probes: Adam's memory traffic with next to no arithmetic.
#include <omp.h>

#include <cstring>

#include "baselines.hpp"

namespace bench {
namespace {

// bfloat16 -> fp32 is a shift.
inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

}  // namespace

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
    const float gi = bf16_to_float(g16[i]);
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

// One read of n values in kReadStreams streams per thread, lane by lane: the
// least a pass that only checks them costs (x * 0 keeps any Inf or NaN, so
// no value can be skipped). load(i) returns value i as a float.
constexpr int kReadStreams = 8, kReadLanes = 16;

template <class Load>
float probe_read(int64_t n, Load load) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
    const int64_t b = n * t / threads, e = n * (t + 1) / threads;
    const int64_t len = (e - b) / (kReadStreams * kReadLanes) * kReadLanes;  // per stream
    float acc[kReadStreams][kReadLanes] = {};
    for (int64_t j = 0; j < len; j += kReadLanes)
      for (int s = 0; s < kReadStreams; ++s)
#pragma omp simd
        for (int l = 0; l < kReadLanes; ++l) acc[s][l] += load(b + s * len + j + l) * 0.0f;
    for (int64_t i = b + kReadStreams * len; i < e; ++i) total += load(i) * 0.0f;
    for (const auto& lanes : acc)
      for (float x : lanes) total += x;
  }
  return total;
}

float probe_read_f32(const float* g, int64_t n) {
  return probe_read(n, [g](int64_t i) { return g[i]; });
}

float probe_read_16(const uint16_t* g16, int64_t n) {
  return probe_read(n, [g16](int64_t i) { return bf16_to_float(g16[i]); });
}

}  // namespace bench
