// The Lion element update (Chen et al., "Symbolic Discovery of Optimization
// Algorithms", 2023), written once for every backend: CPU SIMD, CPU scalar
// and CUDA. One fp32 moment m; the constants are Adam's without bias
// correction (adam_consts with bias_correction false, decoupled true):
//   c = beta1 m + (1 - beta1) g
//   p = p - lr wd p - lr sign(c)
//   m = beta2 m + (1 - beta2) g
#pragma once
#include "math/adam.hpp"

namespace dsopt {

DSOPT_ISA_BEGIN

// sign(x) as -1, 0 or +1 (-0 stays -0, NaN reads +1): x scaled by 2^200 in
// two exact-or-saturating steps lifts every nonzero finite value, the
// smallest subnormal included, to at least 1 in magnitude, and the clamp
// to [-1, 1] keeps only its sign. min/max have the x86 semantics of
// ScalarOps on every backend.
template <class Ops>
DSOPT_HD typename Ops::F lion_sign(typename Ops::F x) {
  const float k = 1.2676506e30f;  // 2^100
  x = Ops::mul(Ops::mul(x, Ops::set1(k)), Ops::set1(k));
  return Ops::max(Ops::min(x, Ops::set1(1.0f)), Ops::set1(-1.0f));
}

// One element (or one vector of elements) of Lion; `g` is the fp32
// gradient after averaging/unscaling/clipping; p and m are updated in place.
template <class Ops>
DSOPT_HD void lion_update(typename Ops::F& p, typename Ops::F& m, typename Ops::F g,
                          const AdamConsts& c) {
  using F = typename Ops::F;
  const F interp = Ops::fma(g, Ops::set1(c.one_minus_beta1), Ops::mul(m, Ops::set1(c.beta1)));
  if (c.wdecay != 0.0f) p = Ops::fma(p, Ops::set1(c.wdecay), p);
  p = Ops::fma(lion_sign<Ops>(interp), Ops::set1(c.step_size), p);
  m = Ops::fma(g, Ops::set1(c.one_minus_beta2), Ops::mul(m, Ops::set1(c.beta2)));
}

// Lion step: m, p from g.
struct LionRule : RuleDefaults {
  using Consts = AdamConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::Grad, Operand::M);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    lion_update<Ops>(e.p, e.m, e.g, c);
  }
};

DSOPT_ISA_END
}  // namespace dsopt
