// The 1-bit LAMB rules (docs/design/onebit-lamb.md section 5, decisions.md L1-L4,
// S1): the element rules every backend runs, and the per-tensor scalar
// steps (trust ratio, its EMA, the compression-stage factor) that the host
// computes in double from the fp32 norms, exactly as DeepSpeed does.
//
// A step is split around per-tensor reductions: an element rule writes the
// update direction u (and what the factor needs) to scratch buffers, the
// kernels reduce them per tensor in the fixed order of math/sum_squares.hpp,
// the host forms one step size per tensor, and lamb_apply moves p.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "math/onebit_adam.hpp"
#include "math/stabilized_momentum.hpp"

namespace dsopt {

// LAMB's constants, one per tensor: the 1-bit rules', and in 1-bit LAMB's
// compression stage the tensor's scaling_coeff (fp32).
struct LambConsts : OneBitConsts {
  float tensor_scale = 1.0f;
};

DSOPT_ISA_BEGIN

// Warmup (and every step of LAMB): m and v from the averaged gradient,
// then the LAMB direction u = m' / (sqrt(v) rbc2 + eps) + wd p with
// m' = m momentum_scale (onebit_direction; both factors are 1 without bias
// correction, which 1-bit LAMB never has: u = m / (sqrt(v) + eps) + wd p).
template <class Ops>
DSOPT_HD void lamb_warmup(typename Ops::F p, typename Ops::F& m, typename Ops::F& v,
                          typename Ops::F& u, typename Ops::F g, const LambConsts& c) {
  onebit_momentum<Ops>(m, g, c);
  onebit_variance<Ops>(v, g, c);
  u = onebit_with_decay<Ops>(onebit_direction<Ops>(m, v, c), p, c);
}

// Compression stage, before the compressed allreduce: m_prev keeps the
// momentum, which is updated with the local gradient and then either put in
// the update's units (c.update_units, the stabilized rule:
// onebit_to_update_units, d = sqrt(v) + eps) or multiplied by the tensor's
// scaling coefficient (c.tensor_scale, DeepSpeed's rule) so that all
// tensors of the fused buffer have the same RMS. v is read only in the
// update's units.
template <class Ops>
DSOPT_HD void lamb_momentum(typename Ops::F& m, typename Ops::F& m_prev, typename Ops::F v,
                            typename Ops::F g, const LambConsts& c) {
  m_prev = m;
  onebit_momentum<Ops>(m, g, c);
  m = c.update_units ? onebit_to_update_units<Ops>(m, v, c) : Ops::mul(m, Ops::set1(c.tensor_scale));
}

// Compression stage, after it. In: m (the averaged, still scaled or in the
// update's units),
// m_prev, mask (1 for none), v (frozen), vf, p. Out: m unscaled and masked;
// with m' and m_prev' the stabilized momenta (c.momentum_limit; 0:
// DeepSpeed's rule, m' = m): vf updated from the reconstructed gradient
// (m' - beta1 m_prev') / (1 - beta1); u0 = m' / (sqrt(v) + eps), u = u0 +
// wd p; ratio = (sqrt(v) + eps) / (sqrt(vf) + eps), whose per-tensor maximum
// is the factor. The factor thus sees the momenta the update applies
// (docs/design/stable-1bit.md, "1-bit LAMB").
template <class Ops>
DSOPT_HD void lamb_compressed(typename Ops::F p, typename Ops::F& m, typename Ops::F m_prev,
                              typename Ops::F mask, typename Ops::F v, typename Ops::F& vf,
                              typename Ops::F& u0, typename Ops::F& u, typename Ops::F& ratio,
                              const LambConsts& c) {
  using F = typename Ops::F;
  m = c.update_units ? onebit_from_update_units<Ops>(m, v, c) : Ops::div(m, Ops::set1(c.tensor_scale));
  m = Ops::mul(m, mask);
  const F root = Ops::sqrt(v);
  const F used = stabilized_momentum<Ops>(m, root, c.momentum_limit);
  const F used_prev = stabilized_momentum<Ops>(m_prev, root, c.momentum_limit);
  const F gr = Ops::div(Ops::fma(Ops::set1(-c.beta1), used_prev, used), Ops::set1(c.one_minus_beta1));
  onebit_variance<Ops>(vf, gr, c);
  const F denom = Ops::add(root, Ops::set1(c.eps));
  u0 = Ops::div(used, denom);
  u = c.wd > 0.0f ? Ops::fma(Ops::set1(c.wd), p, u0) : u0;
  ratio = Ops::div(denom, Ops::add(Ops::sqrt(vf), Ops::set1(c.eps)));
}

// p = p + step_size * u, step_size = fl32(-lr * coeff) of the tensor.
template <class Ops>
DSOPT_HD void lamb_apply(typename Ops::F& p, typename Ops::F u, const AdamConsts& c) {
  p = Ops::fma(Ops::set1(c.step_size), u, p);
}

// The rules, with per-tensor constants (a slot's group indexes one per
// tensor). Warmup: m, v from g; u = the LAMB direction; p untouched.
struct LambWarmupRule : RuleDefaults {
  using Consts = LambConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::Grad, Operand::M, Operand::V);
  static constexpr OperandSet kWrites = operands(Operand::M, Operand::V, Operand::U);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    lamb_warmup<Ops>(e.p, e.m, e.v, e.u, e.g, c);
  }
};

// Before the compressed allreduce: aux = m, m = the scaled momentum; v is
// read only in the update's units.
struct LambMomentumRule : RuleDefaults {
  using Consts = LambConsts;
  static constexpr OperandSet kReads = operands(Operand::Grad, Operand::M);
  static constexpr OperandSet kReadsWhen = operands(Operand::V);
  static constexpr OperandSet kWrites = operands(Operand::M, Operand::Aux);
  DSOPT_HD static bool when(const Consts& c, bool) { return c.update_units; }
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    lamb_momentum<Ops>(e.m, e.aux, e.v, e.g, c);
  }
};

// After it: m, vf; aux = u0, u, ratio (scratch). Reads no gradient.
struct LambCompressedRule : RuleDefaults {
  using Consts = LambConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::M, Operand::Aux,
                                                Operand::Mask, Operand::V, Operand::VF);
  static constexpr OperandSet kWrites =
      operands(Operand::M, Operand::VF, Operand::Aux, Operand::U, Operand::Ratio);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    const typename Ops::F m_prev = e.aux;
    lamb_compressed<Ops>(e.p, e.m, m_prev, e.mask, e.v, e.vf, e.aux, e.u, e.ratio, c);
  }
};

// p += step_size * u. Reads no gradient.
struct LambApplyRule : RuleDefaults {
  using Consts = LambConsts;
  static constexpr OperandSet kReads = operands(Operand::Param, Operand::U);
  static constexpr OperandSet kWrites = operands(Operand::Param);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    lamb_apply<Ops>(e.p, e.u, c);
  }
};

DSOPT_ISA_END

// ---- host scalars (double, as DeepSpeed's Python floats) ---------------------

struct LambCoeffConfig {
  double max_coeff = 10.0, min_coeff = 0.01, coeff_beta = 0.9;
  double factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;
};

// An fp32 norm from a sum of squares (the device's torch.norm).
inline float lamb_norm(double sumsq) { return float(std::sqrt(sumsq)); }

// The warmup trust ratio ||p|| / ||u||, formed in fp32, clamped in double;
// 1.0 when either norm is 0.
inline double lamb_warmup_coeff(double p_sumsq, double u_sumsq, const LambCoeffConfig& k) {
  const float wn = lamb_norm(p_sumsq), un = lamb_norm(u_sumsq);
  if (wn == 0.0f || un == 0.0f) return 1.0;
  double coeff = double(wn / un);
  if (coeff > k.max_coeff) coeff = k.max_coeff;
  if (coeff < k.min_coeff) coeff = k.min_coeff;
  return coeff;
}

// lamb_coeff_freeze after a warmup coefficient (exact 1.0 is skipped).
inline double lamb_coeff_ema(double freeze, double coeff, const LambCoeffConfig& k) {
  return coeff != 1.0 ? k.coeff_beta * freeze + (1.0 - k.coeff_beta) * coeff : freeze;
}

// scaling_coeff of each of `count` tensors from the sums of squares of their
// momenta (docs/design/onebit-lamb.md 5.1): mean RMS / own RMS; 1.0 for an
// all-zero momentum (decisions.md L1).
inline void lamb_scaling_coeffs(const double* m_sumsq, const int64_t* numel, int64_t count,
                                double* out) {
  double united = 0.0;
  for (int64_t i = 0; i < count; ++i)
    united += double(lamb_norm(m_sumsq[i]) / float(std::sqrt(double(numel[i]))));
  united /= double(count);
  for (int64_t i = 0; i < count; ++i) {
    const double rms = double(lamb_norm(m_sumsq[i]) / float(std::sqrt(double(numel[i]))));
    out[i] = rms == 0.0 ? 1.0 : united / rms;
  }
}

// The compression-stage factor of one tensor (docs/design/onebit-lamb.md 5.4) from the maximum
// denominator ratio and the sums of squares of u0 and u; `last` is the
// previous factor. Returns the new factor.
inline double lamb_factor(float max_ratio, double u0_sumsq, double u_sumsq, bool decay,
                          double last, const LambCoeffConfig& k) {
  double factor = double(max_ratio);
  if (decay) {
    const double ratio = std::min(1.0, double(lamb_norm(u0_sumsq) / lamb_norm(u_sumsq)));
    factor = factor * ratio + (1.0 - ratio);
  }
  if (factor > k.factor_max) factor = k.factor_max;
  if (factor < k.factor_min) factor = k.factor_min;
  if (factor > last * (1.0 + k.factor_threshold)) factor = last * (1.0 + k.factor_threshold);
  if (factor < last * (1.0 - k.factor_threshold)) factor = last * (1.0 - k.factor_threshold);
  return factor;
}

}  // namespace dsopt
