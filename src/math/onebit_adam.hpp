// The 1-bit Adam element rules (spec onebit-adam.md section 5): Adam
// without bias correction, decoupled weight decay added to the update, and
// the momentum update split from the parameter update around the
// compressed allreduce. Written once for every backend.
#pragma once
#include "math/adam.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

// Constants for the 1-bit rules: step_size = -lr, wd = the decoupled decay
// coefficient, no bias correction.
inline AdamConsts onebit_consts(const AdamHyper& h) {
  AdamConsts c = adam_consts(AdamHyper{h.lr, h.beta1, h.beta2, h.eps, 0.0, false, true}, 1);
  c.wd = float(h.weight_decay);
  c.wdecay = 0.0f;
  c.momentum_limit = 0.0f;
  return c;
}

// m = beta1 m + (1 - beta1) g
template <class Ops>
DSOPT_HD void onebit_momentum(typename Ops::F& m, typename Ops::F g, const AdamConsts& c) {
  m = Ops::mul(m, Ops::set1(c.beta1));
  m = Ops::fma(g, Ops::set1(c.one_minus_beta1), m);
}

// p = p - lr (m / (sqrt(v) + eps) + wd p). With c.momentum_limit = L > 0
// (the stabilized compression stage, docs/design/stable-1bit.md) the m of
// the update is first clamped to [-L sqrt(v), L sqrt(v)]: a coordinate never
// moves faster than its own warmup gradient RMS allows, and one whose v is 0
// (no gradient during warmup) does not move. The stored momentum is not
// clamped.
template <class Ops>
DSOPT_HD void onebit_apply(typename Ops::F& p, typename Ops::F m, typename Ops::F v,
                           const AdamConsts& c) {
  using F = typename Ops::F;
  const F root = Ops::sqrt(v);
  if (c.momentum_limit > 0.0f) {
    const F bound = Ops::mul(root, Ops::set1(c.momentum_limit));
    m = Ops::min(Ops::max(m, Ops::mul(bound, Ops::set1(-1.0f))), bound);
  }
  const F d = Ops::add(root, Ops::set1(c.eps));
  F u = Ops::div(m, d);
  if (c.wd > 0.0f) u = Ops::fma(Ops::set1(c.wd), p, u);
  p = Ops::fma(Ops::set1(c.step_size), u, p);
}

// Warmup: momentum, variance, then the parameter.
template <class Ops>
DSOPT_HD void onebit_warmup(typename Ops::F& p, typename Ops::F& m, typename Ops::F& v,
                            typename Ops::F g, const AdamConsts& c) {
  onebit_momentum<Ops>(m, g, c);
  v = Ops::mul(v, Ops::set1(c.beta2));
  v = Ops::fma(Ops::mul(g, g), Ops::set1(c.one_minus_beta2), v);
  onebit_apply<Ops>(p, m, v, c);
}

// The stabilized rule's limit for a group whose v was frozen after
// `warmup_updates` updates: limit / sqrt(1 - beta2^warmup_updates), so that
// the bound is `limit` times the bias-corrected warmup RMS of the gradient.
inline float onebit_momentum_limit(double limit, double beta2, int64_t warmup_updates) {
  const double b2t = std::pow(beta2, double(warmup_updates < 1 ? 1 : warmup_updates));
  return float(limit / std::sqrt(1.0 - b2t));
}

DSOPT_ISA_END
}  // namespace dsopt
