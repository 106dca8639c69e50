// What an update rule declares: the streams of a tensor it reads and
// writes, and its element function over one bundle of them (one vector of
// elements on the CPU, one float on CUDA). The CPU loop
// (src/kernels/cpu/update_loop.hpp) and the CUDA functor
// (cuda/update_kernel.cuh) load, apply and store from the declaration
// alone; the rules are listed once in math/update_rules.hpp.
#pragma once
#include <cstdint>
#include <type_traits>

#include "math/hd.hpp"

namespace dsopt {

// The streams of one tensor an update can touch, fp32 unless noted.
enum class Operand : int {
  Param,    // the fp32 value updated in place: the caller's, or dsopt's master copy
  Param16,  // the 16-bit copy of a 16-bit parameter: written with Param, never declared
  Grad,     // the gradient in its dtype, read as fl(fl(g * mul1) * mul2)
  M,        // first moment
  V,        // second moment
  Mask,     // momentum mask; a tensor without one reads 1 (RuleElements::masked false)
  VF,       // 1-bit LAMB: the fresh variance
  U,        // 1-bit LAMB scratch: the update direction
  Aux,      // 1-bit LAMB scratch: the previous momentum, then u0
  Ratio,    // 1-bit LAMB scratch: the denominator ratio
  Acc,      // 0/1 Adam: the accumulator
  Anchor,   // 0/1 Adam: the parameters of the last sync
};
constexpr int kOperandCount = 12;
static_assert(int(Operand::Anchor) + 1 == kOperandCount, "kOperandCount counts every operand");

// A set of operands, bit int(o) for operand o.
using OperandSet = uint32_t;
template <Operand O>
constexpr OperandSet kOperandBit = OperandSet(1) << int(O);

template <class... O>
constexpr OperandSet operands(O... o) {
  return (OperandSet(0) | ... | (OperandSet(1) << int(o)));
}

// The streams a rule touches: what it declares, plus the 16-bit copy when
// it writes the parameter.
template <class Rule>
constexpr OperandSet kRuleStreams =
    Rule::kReads | Rule::kWrites | Rule::kReadsWhen | Rule::kWritesWhen |
    ((Rule::kWrites & kOperandBit<Operand::Param>) ? kOperandBit<Operand::Param16> : 0);
template <class Rule>
constexpr bool kRuleReadsGrad = (Rule::kReads & kOperandBit<Operand::Grad>) != 0;
template <class Rule>
constexpr bool kRuleWritesParam = (Rule::kWrites & kOperandBit<Operand::Param>) != 0;
template <class Rule>
constexpr bool kRuleReadsMask = (Rule::kReads & kOperandBit<Operand::Mask>) != 0;

DSOPT_ISA_BEGIN

// Declarations a rule leaves out: no operand read or written under a
// runtime condition. A rule that has some lists them in kReadsWhen (read
// when `when` holds, else 0) and kWritesWhen (stored only when it holds),
// and gives `when`, evaluated once per tensor. Every rule also names the
// constants it reads (`using Consts = ...`: AdamConsts or a struct that
// extends it), one per group or tensor.
struct RuleDefaults {
  static constexpr OperandSet kReadsWhen = 0;
  static constexpr OperandSet kWritesWhen = 0;
  template <class Consts>
  DSOPT_HD static bool when(const Consts&, bool /*masked*/) { return true; }
};

// One bundle of elements: every operand's value in registers.
template <class Ops>
struct RuleElements {
  using F = typename Ops::F;
  F p, g, m, v, mask, vf, u, aux, ratio, acc, anchor;
  bool masked;  // the tensor has a mask (else mask reads 1)

  // The register of operand O (Param16 has none: it is stored from p).
  template <Operand O>
  DSOPT_HD F& at() {
    if constexpr (O == Operand::Param) return p;
    else if constexpr (O == Operand::Grad) return g;
    else if constexpr (O == Operand::M) return m;
    else if constexpr (O == Operand::V) return v;
    else if constexpr (O == Operand::Mask) return mask;
    else if constexpr (O == Operand::VF) return vf;
    else if constexpr (O == Operand::U) return u;
    else if constexpr (O == Operand::Aux) return aux;
    else if constexpr (O == Operand::Ratio) return ratio;
    else if constexpr (O == Operand::Acc) return acc;
    else {
      static_assert(O == Operand::Anchor, "Param16 has no register");
      return anchor;
    }
  }
};

// fn(std::integral_constant<Operand, O>) for every operand, in order.
template <class Fn>
DSOPT_HD void for_each_operand(Fn&& fn) {
  fn(std::integral_constant<Operand, Operand::Param>{});
  fn(std::integral_constant<Operand, Operand::Param16>{});
  fn(std::integral_constant<Operand, Operand::Grad>{});
  fn(std::integral_constant<Operand, Operand::M>{});
  fn(std::integral_constant<Operand, Operand::V>{});
  fn(std::integral_constant<Operand, Operand::Mask>{});
  fn(std::integral_constant<Operand, Operand::VF>{});
  fn(std::integral_constant<Operand, Operand::U>{});
  fn(std::integral_constant<Operand, Operand::Aux>{});
  fn(std::integral_constant<Operand, Operand::Ratio>{});
  fn(std::integral_constant<Operand, Operand::Acc>{});
  fn(std::integral_constant<Operand, Operand::Anchor>{});
}

DSOPT_ISA_END
}  // namespace dsopt
