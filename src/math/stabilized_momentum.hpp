// The stabilized compression stage shared by the 1-bit optimizers
// (docs/design/decisions.md S1, docs/design/stable-1bit.md): the momentum an update applies
// is clamped to +-L sqrt(v) of the frozen variance, so a coordinate never
// moves faster than its own warmup gradient RMS allows, and one whose v is
// 0 (no gradient during warmup) does not move. Written once for every
// backend and every optimizer that freezes v.
#pragma once
#include <cmath>
#include <cstdint>

#include "math/hd.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

// m clamped to [-limit * root, limit * root] (root = sqrt(v)); limit 0
// leaves m as it is (DeepSpeed's rule).
template <class Ops>
DSOPT_HD typename Ops::F stabilized_momentum(typename Ops::F m, typename Ops::F root, float limit) {
  if (limit > 0.0f) {
    const typename Ops::F bound = Ops::mul(root, Ops::set1(limit));
    m = Ops::min(Ops::max(m, Ops::mul(bound, Ops::set1(-1.0f))), bound);
  }
  return m;
}

// The limit for v frozen after `warmup_updates` updates without bias
// correction: limit / sqrt(1 - beta2^warmup_updates), so that the bound is
// `limit` times the bias-corrected warmup RMS of the gradient.
inline float onebit_momentum_limit(double limit, double beta2, int64_t warmup_updates) {
  const double b2t = std::pow(beta2, double(warmup_updates < 1 ? 1 : warmup_updates));
  return float(limit / std::sqrt(1.0 - b2t));
}

DSOPT_ISA_END
}  // namespace dsopt
