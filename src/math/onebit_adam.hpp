// The 1-bit Adam element rules (spec onebit-adam.md section 5): Adam
// without bias correction, decoupled weight decay added to the update, and
// the momentum update split from the parameter update around the
// compressed allreduce. Written once for every backend.
#pragma once
#include "math/adam.hpp"
#include "math/stabilized_momentum.hpp"

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

// v = beta2 v + (1 - beta2) g^2
template <class Ops>
DSOPT_HD void onebit_variance(typename Ops::F& v, typename Ops::F g, const AdamConsts& c) {
  v = Ops::mul(v, Ops::set1(c.beta2));
  v = Ops::fma(Ops::mul(g, g), Ops::set1(c.one_minus_beta2), v);
}

// p = p - lr (m / (sqrt(v) + eps) + wd p). With c.momentum_limit = L > 0
// (the stabilized compression stage, math/stabilized_momentum.hpp) the m of
// the update is first clamped to [-L sqrt(v), L sqrt(v)]. The stored
// momentum is not clamped.
template <class Ops>
DSOPT_HD void onebit_apply(typename Ops::F& p, typename Ops::F m, typename Ops::F v,
                           const AdamConsts& c) {
  using F = typename Ops::F;
  const F root = Ops::sqrt(v);
  m = stabilized_momentum<Ops>(m, root, c.momentum_limit);
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
  onebit_variance<Ops>(v, g, c);
  onebit_apply<Ops>(p, m, v, c);
}

DSOPT_ISA_END
}  // namespace dsopt
