// The plain AdamW loop: what a straightforward compiled implementation gets.
#include <cmath>

#include "baselines.hpp"

namespace bench {

void plain_adamw_step(float* p, const float* g, float* m, float* v, int64_t n,
                      const PlainAdamW& h, int64_t t) {
  const float bc1 = 1.0f - float(std::pow(double(h.beta1), double(t)));
  const float bc2 = 1.0f - float(std::pow(double(h.beta2), double(t)));
  const float step_size = h.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.0f - h.lr * h.weight_decay;
  const float b1 = h.beta1, b2 = h.beta2, eps = h.eps;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

}  // namespace bench
