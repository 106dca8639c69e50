// Reference loops the dsopt CPU step is compared against, each in its own
// translation unit built with -O3 -march=native -fno-math-errno -fopenmp, so
// that the compiler sees nothing of the benchmark driver. All run on the
// current OpenMP thread count.
#pragma once
#include <cstdint>

namespace bench {

// Textbook AdamW (as torch.optim.AdamW computes it): decoupled decay, bias
// correction, sqrt and division per element. t is the step number, >= 1.
struct PlainAdamW {
  float lr, beta1, beta2, eps, weight_decay;
};
void plain_adamw_step(float* p, const float* g, float* m, float* v, int64_t n,
                      const PlainAdamW& h, int64_t t);

// Streaming probes: the memory traffic of one Adam step with trivial
// arithmetic, i.e. what this machine's memory system allows.
// fp32: reads p, g, m, v and writes p, m, v (28 bytes per element).
void probe_f32(float* p, const float* g, float* m, float* v, int64_t n);
// 16-bit parameters with fp32 masters: reads master, g16, m, v and writes
// master, m, v, p16 (4+2+4+4 + 4+4+4+2 = 28 bytes per element).
void probe_16(float* master, const uint16_t* g16, float* m, float* v, uint16_t* p16, int64_t n);
// One read of the gradients (4 or 2 bytes per element), as a pass that only
// checks them makes: NaN when one is Inf or NaN.
float probe_read_f32(const float* g, int64_t n);
float probe_read_16(const uint16_t* g16, int64_t n);

}  // namespace bench
