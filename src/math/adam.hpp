// The Adam / AdamW element update (docs/design/adam.md section 3.4, decisions.md A1),
// written once for every backend: CPU SIMD, CPU scalar and CUDA.
#pragma once
#include <cmath>

#include "math/hd.hpp"
#include "math/update_rule.hpp"

namespace dsopt {

// Hyperparameters of one parameter group, as configured.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool decoupled = true;  // AdamW: decay applied to p; false: L2, added to g
  // The values of an algorithm's hyperparameters that Adam lacks, where its
  // descriptor places them (optim/hyper_params.hpp); its rule reads them.
  double extra[4] = {0.0, 0.0, 0.0, 0.0};
};

// Per-group, per-step fp32 constants of the Adam update; the other rules'
// constants extend them (OneBitConsts, LambConsts, ZeroOneConsts).
struct AdamConsts {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
  float rbc2;       // 1 / sqrt(1 - beta2^t), or 1
  float step_size;  // -lr / (1 - beta1^t), or -lr
  float wd;         // L2 coefficient (0 in AdamW mode)
  float wdecay;     // -lr * wd (0 in L2 mode)
};

DSOPT_ISA_BEGIN

// Host-side constants for step t >= 1: beta^t from the step counter in
// double, everything else formed in fp32 as docs/design/adam.md section 3.3 lists it.
inline AdamConsts adam_consts(const AdamHyper& h, long long t) {
  AdamConsts c;
  const float lr = float(h.lr), wd = float(h.weight_decay);
  c.beta1 = float(h.beta1);
  c.beta2 = float(h.beta2);
  c.one_minus_beta1 = 1.0f - c.beta1;
  c.one_minus_beta2 = 1.0f - c.beta2;
  c.eps = float(h.eps);
  float bc1 = 1.0f, rbc2 = 1.0f;
  if (h.bias_correction) {
    const float b1t = float(std::pow(double(c.beta1), double(t)));
    const float b2t = float(std::pow(double(c.beta2), double(t)));
    bc1 = 1.0f - b1t;
    rbc2 = 1.0f / std::sqrt(1.0f - b2t);
  }
  c.rbc2 = rbc2;
  c.step_size = -lr / bc1;
  c.wd = h.decoupled ? 0.0f : wd;
  c.wdecay = h.decoupled ? -lr * wd : 0.0f;
  return c;
}

// One element (or one vector of elements) of Adam/AdamW. `g` is the fp32
// gradient after averaging/unscaling/clipping; p, m, v are updated in place.
template <class Ops>
DSOPT_HD void adam_update(typename Ops::F& p, typename Ops::F& m, typename Ops::F& v,
                          typename Ops::F g, const AdamConsts& c) {
  using F = typename Ops::F;
  if (c.wd > 0.0f) g = Ops::fma(p, Ops::set1(c.wd), g);
  m = Ops::mul(m, Ops::set1(c.beta1));
  m = Ops::fma(g, Ops::set1(c.one_minus_beta1), m);
  v = Ops::mul(v, Ops::set1(c.beta2));
  const F g2 = Ops::mul(g, g);
  v = Ops::fma(g2, Ops::set1(c.one_minus_beta2), v);
  F s = Ops::sqrt(v);
  s = Ops::fma(s, Ops::set1(c.rbc2), Ops::set1(c.eps));
  const F q = Ops::div(m, s);
  if (c.wdecay != 0.0f) p = Ops::fma(p, Ops::set1(c.wdecay), p);
  p = Ops::fma(q, Ops::set1(c.step_size), p);
}

// Adam/AdamW step: m, v, p from g.
struct AdamRule : RuleDefaults {
  using Consts = AdamConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::Grad, Operand::M, Operand::V);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M, Operand::V);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    adam_update<Ops>(e.p, e.m, e.v, e.g, c);
  }
};

DSOPT_ISA_END
}  // namespace dsopt
