// The 0/1 Adam element rules (docs/design/zero-one-adam.md section 4, decisions.md
// Z1, S1), written once for every backend. Full steps are 1-bit Adam's
// warmup rule (onebit_warmup); these are the other kinds of step.
#pragma once
#include "math/stabilized_momentum.hpp"
#include "math/onebit_adam.hpp"

namespace dsopt {

// 0/1 Adam's constants: the 1-bit rules', and the sum of learning rates
// since the last sync, the factor the parameters of the last sync get at a
// sync (decoupled_sync_weight_decay), and whether the accumulator leaves
// the decay out.
struct ZeroOneConsts : OneBitConsts {
  float lrs = 0.0f;
  float anchor_decay = 1.0f;
  bool decoupled_sync = false;
};

DSOPT_ISA_BEGIN

// 1-bit step: g is the decompressed average of the ranks' gradients (or the
// local gradient with one rank, Z2), masked; v is left alone.
template <class Ops>
DSOPT_HD void zoadam_gradient(typename Ops::F& p, typename Ops::F& m, typename Ops::F v,
                              typename Ops::F g, const ZeroOneConsts& c) {
  onebit_momentum<Ops>(m, g, c);
  onebit_apply<Ops>(p, m, v, c);
}

// Local step: p = p - lr u, acc = acc - lr u with u = m / d + wd p
// (DeepSpeed: the accumulator holds the whole update); with
// decoupled_sync the accumulator gets only -lr m / d.
template <class Ops>
DSOPT_HD void zoadam_local(typename Ops::F& p, typename Ops::F& m, typename Ops::F v,
                           typename Ops::F& acc, typename Ops::F g, const ZeroOneConsts& c) {
  using F = typename Ops::F;
  onebit_momentum<Ops>(m, g, c);
  const F q = onebit_direction<Ops>(m, v, c);
  const F u = onebit_with_decay<Ops>(q, p, c);
  const F step = Ops::set1(c.step_size);
  acc = Ops::fma(step, c.decoupled_sync ? q : u, acc);
  p = Ops::fma(step, u, p);
}

// Sync, before the compressed allreduce (in the update's units the
// accumulator goes as it is, and this is applied to the allreduce's
// result, before the mask): acc = acc * (sqrt(v) rbc2 + eps), the accumulated
// update turned back into a sum of momenta weighted by the local steps' lr
// (times their bias correction, momentum_scale).
template <class Ops>
DSOPT_HD void zoadam_sync_prepare(typename Ops::F& acc, typename Ops::F v, const ZeroOneConsts& c) {
  acc = onebit_from_update_units<Ops>(acc, v, c);
}

// Sync, after it (acc is the average, identical on every rank, masked):
// m = -(acc / lrs); p = anchor + acc / (sqrt(v) rbc2 + eps), from the parameters
// of the last sync rather than by undoing this rank's own accumulator, so
// every rank ends with the same bits. lrs sums lr x momentum_scale over the
// interval, so m is the weighted mean of the uncorrected momenta. With c.momentum_limit > 0 (the
// stabilized rule, then fl(L * lrs)) the acc of the correction is clamped
// to +-momentum_limit * sqrt(v): no coordinate moves further than lrs times
// its own bound. decoupled_sync: the anchor first decays by anchor_decay.
// lrs = 0 (lr 0 over the whole interval, so acc = 0): m is kept, where
// DeepSpeed's 0 / 0 would make it NaN.
template <class Ops>
DSOPT_HD void zoadam_sync_apply(typename Ops::F& p, typename Ops::F& m, typename Ops::F v,
                                typename Ops::F acc, typename Ops::F anchor,
                                const ZeroOneConsts& c) {
  using F = typename Ops::F;
  if (c.lrs != 0.0f) m = Ops::mul(Ops::div(acc, Ops::set1(c.lrs)), Ops::set1(-1.0f));
  const F root = Ops::sqrt(v);
  acc = stabilized_momentum<Ops>(acc, root, c.momentum_limit);
  if (c.decoupled_sync) anchor = Ops::mul(anchor, Ops::set1(c.anchor_decay));
  p = Ops::add(anchor, Ops::div(acc, onebit_denominator<Ops>(root, c)));
}

// The rules; full steps are OneBitWarmupRule. 1-bit step, before the
// compressed allreduce: acc (the staged gradient) clamped, / d.
struct ZeroOneGradientPrepareRule : RuleDefaults {
  using Consts = ZeroOneConsts;
  static constexpr OperandSet kReads = operands(Operand::V, Operand::Acc);
  static constexpr OperandSet kWrites = operands(Operand::Acc);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    e.acc = onebit_to_update_units<Ops>(e.acc, e.v, c);
  }
};

// 1-bit step, after it: g (decompressed) *= d (update units), *= mask; m
// from g, p from m and v.
struct ZeroOneGradientRule : RuleDefaults {
  using Consts = ZeroOneConsts;
  static constexpr OperandSet kReads =
      operands(Operand::Param, Operand::Grad, Operand::M, Operand::V, Operand::Mask);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    if (c.update_units) e.g = onebit_from_update_units<Ops>(e.g, e.v, c);
    if (e.masked) e.g = Ops::mul(e.g, e.mask);
    zoadam_gradient<Ops>(e.p, e.m, e.v, e.g, c);
  }
};

// Local step: m from g, p and the accumulator from m and v.
struct ZeroOneLocalRule : RuleDefaults {
  using Consts = ZeroOneConsts;
  static constexpr OperandSet kReads =
      operands(Operand::Param, Operand::Grad, Operand::M, Operand::V, Operand::Acc);
  static constexpr OperandSet kWrites = operands(Operand::Param, Operand::M, Operand::Acc);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    zoadam_local<Ops>(e.p, e.m, e.v, e.acc, e.g, c);
  }
};

// Before the sync's compressed allreduce: acc *= sqrt(v) rbc2 + eps.
struct ZeroOneSyncPrepareRule : RuleDefaults {
  using Consts = ZeroOneConsts;
  static constexpr OperandSet kReads = operands(Operand::V, Operand::Acc);
  static constexpr OperandSet kWrites = operands(Operand::Acc);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    zoadam_sync_prepare<Ops>(e.acc, e.v, c);
  }
};

// After it: acc *= d (update units: instead of the prepare), *= mask; m
// from acc (kept when lrs is 0, so read), p from the last sync's
// parameters and acc; anchor = p, acc = 0.
struct ZeroOneSyncApplyRule : RuleDefaults {
  using Consts = ZeroOneConsts;
  static constexpr OperandSet kReads =
      operands(Operand::M, Operand::V, Operand::Mask, Operand::Acc, Operand::Anchor);
  static constexpr OperandSet kWrites =
      operands(Operand::Param, Operand::M, Operand::Acc, Operand::Anchor);
  template <class Ops>
  DSOPT_HD static void apply(RuleElements<Ops>& e, const Consts& c) {
    if (c.update_units) e.acc = onebit_from_update_units<Ops>(e.acc, e.v, c);
    if (e.masked) e.acc = Ops::mul(e.acc, e.mask);
    zoadam_sync_apply<Ops>(e.p, e.m, e.v, e.acc, e.anchor, c);
    e.anchor = e.p;
    e.acc = Ops::set1(0.0f);
  }
};

DSOPT_ISA_END
}  // namespace dsopt
