// The streaming probes (stream_probe.cpp) behind C names, built as a shared
// library for adam_cpu_peers.py, which times them in its own process.
#include <cstdint>

#include "baselines.hpp"

extern "C" {

void dsopt_bench_probe_f32(float* p, const float* g, float* m, float* v, int64_t n) {
  bench::probe_f32(p, g, m, v, n);
}

void dsopt_bench_probe_16(float* master, const uint16_t* g16, float* m, float* v, uint16_t* p16,
                          int64_t n) {
  bench::probe_16(master, g16, m, v, p16, n);
}

float dsopt_bench_probe_read_f32(const float* g, int64_t n) { return bench::probe_read_f32(g, n); }

float dsopt_bench_probe_read_16(const uint16_t* g16, int64_t n) { return bench::probe_read_16(g16, n); }
}
