// The 1-bit Adam element rules (docs/optimizers/onebit-adam.md "1-bit Adam"): Adam with bias
// correction by default (without it: DeepSpeed's rule), decoupled weight
// decay added to the update, and the momentum update split from the
// parameter update around the compressed allreduce. Written once for every
// backend.
#pragma once
#include <cmath>
#include <cstdint>

#include "math/adam.hpp"
#include "math/stabilized_momentum.hpp"

namespace dsopt {

// The 1-bit rules' constants: Adam's, and
struct OneBitConsts : AdamConsts {
  // compression stage, stabilized rule: the applied momentum of an element
  // is clamped to +-momentum_limit * sqrt(v) (math/stabilized_momentum.hpp);
  // 0: not clamped (DeepSpeed's rule, and the warmup);
  float momentum_limit = 0.0f;
  // with bias correction the momentum is multiplied by 1 / (1 - beta1^t)
  // before it is used (and rbc2 corrects the variance by its own update
  // count); 1: uncorrected (DeepSpeed's rule);
  float momentum_scale = 1.0f;
  // stabilized rule, more than one rank: what goes through the compressed
  // allreduce is in the update's units, x / d with d = sqrt(v) rbc2 + eps,
  // and comes back multiplied by d (onebit_to_update_units).
  bool update_units = false;
};

DSOPT_ISA_BEGIN

// 1 / (1 - beta1^t), the bias correction of a momentum after t updates
// (t < 1 taken as 1); 1 without bias correction. beta1 as the kernels see
// it (fp32), the power in double.
inline double onebit_momentum_scale(const AdamHyper& h, bool bias_correction, int64_t t) {
  if (!bias_correction) return 1.0;
  return 1.0 / (1.0 - std::pow(double(float(h.beta1)), double(t < 1 ? 1 : t)));
}

// Constants for the 1-bit rules at update t, whose v has had
// `variance_updates` updates: step_size = -lr, wd = the decoupled decay
// coefficient; with bias correction momentum_scale = 1 / (1 - beta1^t) and
// rbc2 = 1 / sqrt(1 - beta2^variance_updates), else both 1.
inline OneBitConsts onebit_consts(const AdamHyper& h, bool bias_correction, int64_t t,
                                  int64_t variance_updates) {
  OneBitConsts c;
  static_cast<AdamConsts&>(c) =
      adam_consts(AdamHyper{h.lr, h.beta1, h.beta2, h.eps, 0.0, false, true}, 1);
  c.wd = float(h.weight_decay);
  c.wdecay = 0.0f;
  c.momentum_limit = 0.0f;
  if (bias_correction) {
    const int64_t k = variance_updates < 1 ? 1 : variance_updates;
    c.momentum_scale = float(onebit_momentum_scale(h, true, t));
    c.rbc2 = float(1.0 / std::sqrt(1.0 - std::pow(double(c.beta2), double(k))));
  }
  return c;
}

// sqrt(v) rbc2 + eps from root = sqrt(v), in one fma (root + eps exactly
// when rbc2 is 1).
template <class Ops>
DSOPT_HD typename Ops::F onebit_denominator(typename Ops::F root, const AdamConsts& c) {
  return Ops::fma(root, Ops::set1(c.rbc2), Ops::set1(c.eps));
}

// Compression in the update's units (the stabilized rule): a momentum or
// gradient x goes through the compressed allreduce as x / d and comes back
// multiplied by d, d = sqrt(v) rbc2 + eps of the tensor's v (the same on
// every rank). One scale per chunk then fits elements whose v differ by
// orders of magnitude, as AdamW's updates do. x is first clamped to the
// bound the update will apply (momentum_limit / momentum_scale times
// sqrt(v), the stabilized bound of an uncorrected momentum), so elements
// that would be clamped anyway (tiny v) do not set the chunk's scale.
template <class Ops>
DSOPT_HD typename Ops::F onebit_to_update_units(typename Ops::F x, typename Ops::F v,
                                                const OneBitConsts& c) {
  const typename Ops::F root = Ops::sqrt(v);
  x = stabilized_momentum<Ops>(x, root, c.momentum_limit / c.momentum_scale);
  return Ops::div(x, onebit_denominator<Ops>(root, c));
}
template <class Ops>
DSOPT_HD typename Ops::F onebit_from_update_units(typename Ops::F x, typename Ops::F v,
                                                  const AdamConsts& c) {
  return Ops::mul(x, onebit_denominator<Ops>(Ops::sqrt(v), c));
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

// q = m' / (sqrt(v) rbc2 + eps), m' = m momentum_scale: the bias-corrected
// direction, eps placed as AdamW places it (with both factors 1, DeepSpeed's
// m / (sqrt(v) + eps) bit for bit). With c.momentum_limit = L > 0 (the
// stabilized compression stage, math/stabilized_momentum.hpp) m' is first
// clamped to [-L sqrt(v), L sqrt(v)]. The stored momentum is not changed.
template <class Ops>
DSOPT_HD typename Ops::F onebit_direction(typename Ops::F m, typename Ops::F v,
                                          const OneBitConsts& c) {
  const typename Ops::F root = Ops::sqrt(v);
  m = Ops::mul(m, Ops::set1(c.momentum_scale));
  m = stabilized_momentum<Ops>(m, root, c.momentum_limit);
  return Ops::div(m, onebit_denominator<Ops>(root, c));
}

// u = q + wd p: the update direction with decoupled weight decay.
template <class Ops>
DSOPT_HD typename Ops::F onebit_with_decay(typename Ops::F q, typename Ops::F p, const AdamConsts& c) {
  return c.wd > 0.0f ? Ops::fma(Ops::set1(c.wd), p, q) : q;
}

// p = p - lr (q + wd p), q = onebit_direction(m, v).
template <class Ops>
DSOPT_HD void onebit_apply(typename Ops::F& p, typename Ops::F m, typename Ops::F v,
                           const OneBitConsts& c) {
  const typename Ops::F u = onebit_with_decay<Ops>(onebit_direction<Ops>(m, v, c), p, c);
  p = Ops::fma(Ops::set1(c.step_size), u, p);
}

// Warmup: momentum, variance, then the parameter.
template <class Ops>
DSOPT_HD void onebit_warmup(typename Ops::F& p, typename Ops::F& m, typename Ops::F& v,
                            typename Ops::F g, const OneBitConsts& c) {
  onebit_momentum<Ops>(m, g, c);
  onebit_variance<Ops>(v, g, c);
  onebit_apply<Ops>(p, m, v, c);
}

// 1-bit Adam warmup: m, v, p from g; no bias correction, decoupled decay.
struct OneBitWarmupRule : RuleDefaults {
  using Consts = OneBitConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::Grad, Operand::M, Operand::V);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M, Operand::V);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    onebit_warmup<Ops>(e.p, e.m, e.v, e.g, c);
  }
};

// 1-bit Adam compression, before the compressed allreduce: m from g, then
// in the update's units (clamped, / d) when c.update_units, which alone
// reads v. The parameter waits for the allreduce.
struct OneBitMomentumRule : RuleDefaults {
  using Consts = OneBitConsts;
  static constexpr OperandSet kReads = operands(Operand::Grad, Operand::M);
  static constexpr OperandSet kReadsWhen = operands(Operand::V);
  static constexpr OperandSet kWrites = operands(Operand::M);
  DSOPT_HD static bool when(const Consts& c, bool) { return c.update_units; }
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    onebit_momentum<Ops>(e.m, e.g, c);
    if (c.update_units) e.m = onebit_to_update_units<Ops>(e.m, e.v, c);
  }
};

// After it: m *= d (update units), m *= mask (if any), p from m and the
// frozen v. Reads no gradient; m is stored only where it changed (masked
// or in the update's units).
struct OneBitApplyRule : RuleDefaults {
  using Consts = OneBitConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::M, Operand::V, Operand::Mask);
  static constexpr OperandSet kWrites = operands(Operand::Param);
  static constexpr OperandSet kWritesWhen = operands(Operand::M);
  DSOPT_HD static bool when(const Consts& c, bool masked) { return masked || c.update_units; }
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    if (c.update_units) e.m = onebit_from_update_units<Ops>(e.m, e.v, c);
    if (e.masked) e.m = Ops::mul(e.m, e.mask);
    onebit_apply<Ops>(e.p, e.m, e.v, c);
  }
};

DSOPT_ISA_END
}  // namespace dsopt
