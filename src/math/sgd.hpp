// The SGD element update, as torch.optim.SGD defines it (momentum,
// dampening, Nesterov, L2 weight decay), written once for every backend:
// CPU SIMD, CPU scalar and CUDA. One fp32 moment, the momentum buffer b:
//   g = g + wd p                           (wd != 0)
//   b = g on the parameter's first step, else momentum b + (1 - dampening) g
//   d = g + momentum b with Nesterov, else b
//   p = p - lr d
// With momentum 0, b is g at every step (torch keeps no buffer then).
// Each line is one fp32 product and sum as torch's CPU kernels form it
// (a + alpha b as one fused multiply-add).
#pragma once
#include "math/adam.hpp"

namespace dsopt {

// Where SGD's group hyperparameters live in AdamHyper (its descriptor,
// src/algorithms/sgd/sgd.cpp): lr and weight_decay in their own fields, the
// rest in AdamHyper::extra.
enum SgdExtra { kSgdMomentum = 0, kSgdDampening = 1, kSgdNesterov = 2 };

DSOPT_ISA_BEGIN

// The constants of step t >= 1 of the parameter, in AdamConsts' fields:
// beta1 the buffer's momentum (0: the buffer is the gradient, on the first
// step or without momentum), one_minus_beta1 its 1 - dampening, beta2 the
// momentum of Nesterov's look-ahead (0: none), wd the L2 coefficient,
// step_size -lr.
inline AdamConsts sgd_consts(const AdamHyper& h, long long t) {
  AdamConsts c{};
  const double momentum = h.extra[kSgdMomentum];
  const bool fresh = t <= 1 || momentum == 0.0;
  c.beta1 = fresh ? 0.0f : float(momentum);
  c.one_minus_beta1 = float(1.0 - h.extra[kSgdDampening]);
  c.beta2 = h.extra[kSgdNesterov] != 0.0 ? float(momentum) : 0.0f;
  c.wd = float(h.weight_decay);
  c.step_size = float(-h.lr);
  return c;
}

template <class Ops>
DSOPT_HD void sgd_update(typename Ops::F& p, typename Ops::F& b, typename Ops::F g,
                         const AdamConsts& c) {
  if (c.wd != 0.0f) g = Ops::fma(p, Ops::set1(c.wd), g);
  if (c.beta1 == 0.0f) b = g;
  else b = Ops::fma(g, Ops::set1(c.one_minus_beta1), Ops::mul(b, Ops::set1(c.beta1)));
  const typename Ops::F d = c.beta2 != 0.0f ? Ops::fma(b, Ops::set1(c.beta2), g) : b;
  p = Ops::fma(d, Ops::set1(c.step_size), p);
}

// SGD step: b, p from g.
struct SgdRule : RuleDefaults {
  using Consts = AdamConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::Grad, Operand::M);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    sgd_update<Ops>(e.p, e.m, e.g, c);
  }
};

DSOPT_ISA_END
}  // namespace dsopt
