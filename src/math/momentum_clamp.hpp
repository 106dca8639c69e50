// The stabilized rule of the 1-bit family (DECISIONS S1,
// docs/design/stable-1bit.md), in one place for every optimizer and
// backend: where the momentum comes out of a 1-bit compression but the
// update divides by a frozen sqrt(v) + eps, the applied value is clamped to
// +-limit * sqrt(v), so that a coordinate never moves faster than its own
// gradient RMS allows and one whose v is 0 does not move.
#pragma once
#include <cmath>
#include <cstdint>

#include "math/hd.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

// min(max(x, -b), b) with b = root * limit (one fp32 rounding for b).
template <class Ops>
DSOPT_HD typename Ops::F clamp_to_root(typename Ops::F x, typename Ops::F root, float limit) {
  using F = typename Ops::F;
  const F bound = Ops::mul(root, Ops::set1(limit));
  return Ops::min(Ops::max(x, Ops::mul(bound, Ops::set1(-1.0f))), bound);
}

// The limit for a v that has had `variance_updates` updates (no bias
// correction in v): limit / sqrt(1 - beta2^K), so that the bound is `limit`
// times the bias-corrected RMS of the gradients v has seen.
inline float onebit_momentum_limit(double limit, double beta2, int64_t variance_updates) {
  const double b2t = std::pow(beta2, double(variance_updates < 1 ? 1 : variance_updates));
  return float(limit / std::sqrt(1.0 - b2t));
}

DSOPT_ISA_END
}  // namespace dsopt
