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

// q = m / (sqrt(v) + eps). With c.momentum_limit = L > 0 (the stabilized
// compression stage, math/stabilized_momentum.hpp) m is first clamped to
// [-L sqrt(v), L sqrt(v)]. The stored momentum is not clamped.
template <class Ops>
DSOPT_HD typename Ops::F onebit_direction(typename Ops::F m, typename Ops::F v, const AdamConsts& c) {
  const typename Ops::F root = Ops::sqrt(v);
  m = stabilized_momentum<Ops>(m, root, c.momentum_limit);
  return Ops::div(m, Ops::add(root, Ops::set1(c.eps)));
}

// u = q + wd p: the update direction with decoupled weight decay.
template <class Ops>
DSOPT_HD typename Ops::F onebit_with_decay(typename Ops::F q, typename Ops::F p, const AdamConsts& c) {
  return c.wd > 0.0f ? Ops::fma(Ops::set1(c.wd), p, q) : q;
}

// p = p - lr (m / (sqrt(v) + eps) + wd p), m clamped as onebit_direction says.
template <class Ops>
DSOPT_HD void onebit_apply(typename Ops::F& p, typename Ops::F m, typename Ops::F v,
                           const AdamConsts& c) {
  const typename Ops::F u = onebit_with_decay<Ops>(onebit_direction<Ops>(m, v, c), p, c);
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
