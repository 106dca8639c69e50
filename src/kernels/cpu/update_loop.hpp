// The one CPU loop of every update rule (math/update_rules.hpp), written
// against a vector type V (VecScalar, VecAvx2, VecAvx512) and driven by the
// rule's declaration (math/update_rule.hpp): load what it reads, apply it,
// store what it writes. Whole vectors first, then the tail through one
// staged vector or one element at a time (VecScalar), with the same math,
// so every element gets the same bits. On request the loop also takes the
// sum of squares of the gradient values it loads, block by block in the
// order of math/sum_squares.hpp (LaneSums), so the norm a step reports
// after its update costs no pass of its own.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/dtype_io.hpp"
#include "kernels/cpu/lane_sums.hpp"
#include "kernels/cpu/vec_scalar.hpp"
#include "kernels/kernels.hpp"
#include "math/sum_squares.hpp"
#include "math/update_rules.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

namespace cpu {

// Whether rule `Rule` touches operand O.
template <class Rule, Operand O>
constexpr bool kUses = (kRuleStreams<Rule> & kOperandBit<O>) != 0;

// One bundle of V::W elements from element i of the streams s: load, apply,
// store. `when` is Rule::when for the tensor; P16 == F32 means "no 16-bit
// parameter to write back". With Summed, the gradient values as loaded
// (before mul1 and mul2) are added to `sums` as the elements k.. of its
// block. Unit: mul1 and mul2 are 1, and the gradient is used as loaded
// (x * 1 is x; a signaling NaN, which the product would quiet, comes out
// of the rule's arithmetic quieted all the same).
template <class Rule, class V, DType G, DType P16, bool Summed = false, bool Unit = false>
inline void apply_at(void* const* s, int64_t i, const typename Rule::Consts& c, bool masked,
                     bool when, typename V::F mul1, typename V::F mul2,
                     LaneSums* sums = nullptr, int64_t k = 0) {
  RuleElements<V> e;
  e.masked = masked;
  for_each_operand([&](auto o) {
    constexpr Operand O = decltype(o)::value;
    const float* const x = static_cast<const float*>(s[int(O)]);
    if constexpr (O == Operand::Param16) {
    } else if constexpr ((Rule::kReads & kOperandBit<O>) != 0) {
      if constexpr (O == Operand::Grad) {
        const typename V::F g = load<V, G>(s[int(O)], i);
        if constexpr (Summed) sums->template add<V>(k, g);
        if constexpr (Unit) e.g = g;
        else e.g = V::mul(V::mul(g, mul1), mul2);
      } else if constexpr (O == Operand::Mask) e.mask = masked ? V::load(x + i) : V::set1(1.0f);
      else e.template at<O>() = V::load(x + i);
    } else if constexpr ((Rule::kReadsWhen & kOperandBit<O>) != 0) {
      e.template at<O>() = when ? V::load(x + i) : V::set1(0.0f);
    }
  });
  Rule::apply(e, c);
  for_each_operand([&](auto o) {
    constexpr Operand O = decltype(o)::value;
    void* const ptr = s[int(O)];
    if constexpr (O == Operand::Param16) {
      if constexpr (kRuleWritesParam<Rule> && P16 != DType::F32) store<V, P16>(ptr, i, e.p);
    } else if constexpr ((Rule::kWrites & kOperandBit<O>) != 0) {
      V::store(static_cast<float*>(ptr) + i, e.template at<O>());
    } else if constexpr ((Rule::kWritesWhen & kOperandBit<O>) != 0) {
      if (when) V::store(static_cast<float*>(ptr) + i, e.template at<O>());
    }
  });
}

// Copies n elements and zero-fills the rest of a W-element stage.
template <int W, class T>
inline T* stage_in(T* stage, const T* src, int64_t n) {
  for (int64_t k = 0; k < n; ++k) stage[k] = src[k];
  for (int64_t k = n; k < W; ++k) stage[k] = T(0);
  return stage;
}
template <class T>
inline void stage_out(T* dst, const T* stage, int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] = stage[k];
}

// The last n < V::W elements of a range, starting at element i, through
// one full vector: every stream the rule touches staged into a W-element
// buffer (zeros past n), the rule applied there, the streams it wrote
// copied back. Vector lanes compute what VecScalar computes, so the bits
// are those of an element-by-element loop, at a fraction of its cost
// (tensors of a few hundred elements spend much of their time in their
// tails otherwise).
template <class Rule, class V, DType G, DType P16>
void apply_tail(void* const* s, int64_t i, int64_t n, const typename Rule::Consts& c, bool masked,
                bool when,
                typename V::F vm1, typename V::F vm2) {
  constexpr int W = V::W;
  alignas(64) float stage[kOperandCount][W];
  alignas(64) uint16_t stage16[W], grad16[W];
  void* t[kOperandCount] = {};
  for_each_operand([&](auto o) {
    constexpr Operand O = decltype(o)::value;
    if constexpr (O == Operand::Param16) {
      if constexpr (kRuleWritesParam<Rule> && P16 != DType::F32) t[int(O)] = stage16;
    } else if constexpr (O == Operand::Grad && kUses<Rule, O> && G != DType::F32) {
      if (s[int(O)])
        t[int(O)] = stage_in<W>(grad16, static_cast<const uint16_t*>(s[int(O)]) + i, n);
    } else if constexpr (kUses<Rule, O>) {
      if (s[int(O)])
        t[int(O)] = stage_in<W>(stage[int(O)], static_cast<const float*>(s[int(O)]) + i, n);
    }
  });
  apply_at<Rule, V, G, P16>(t, 0, c, masked, when, vm1, vm2);
  for_each_operand([&](auto o) {
    constexpr Operand O = decltype(o)::value;
    if constexpr (O == Operand::Param16) {
      if constexpr (kRuleWritesParam<Rule> && P16 != DType::F32)
        stage_out(static_cast<uint16_t*>(s[int(O)]) + i, stage16, n);
    } else if constexpr (((Rule::kWrites | Rule::kWritesWhen) & kOperandBit<O>) != 0) {
      stage_out(static_cast<float*>(s[int(O)]) + i, stage[int(O)], n);
    }
  });
}

// Elements [i, end) of the streams, whole vectors first, then the last
// end - i < V::W through one staged vector or element by element. With
// Summed, element i is element k of its sum block (k a multiple of V::W),
// and the gradient values go to `sums`.
template <class Rule, class V, DType G, DType P16, bool Summed>
void rule_run(void* const* streams, int64_t i, int64_t end, const typename Rule::Consts& consts,
              float mul1, float mul2, LaneSums* sums = nullptr, int64_t k = 0) {
  // Local copies, which the loop's stores cannot alias: the stream pointers
  // and constants stay in registers instead of being reloaded every vector.
  void* s[kOperandCount];
  for (int o = 0; o < kOperandCount; ++o) s[o] = streams[o];
  const typename Rule::Consts c = consts;
  const bool masked = kRuleReadsMask<Rule> && s[int(Operand::Mask)] != nullptr;
  const bool when = Rule::when(c, masked);
  const typename V::F vm1 = V::set1(mul1), vm2 = V::set1(mul2);
  if (mul1 == 1.0f && mul2 == 1.0f)  // no loss scale, clipping or mean: two products fewer
    for (; i + V::W <= end; i += V::W, k += V::W)
      apply_at<Rule, V, G, P16, Summed, true>(s, i, c, masked, when, vm1, vm2, sums, k);
  else
    for (; i + V::W <= end; i += V::W, k += V::W)
      apply_at<Rule, V, G, P16, Summed>(s, i, c, masked, when, vm1, vm2, sums, k);
  if constexpr (Summed)  // the tail's gradient values, the last of their lanes
    for (int64_t j = i; j < end; ++j)
      sums->template add<VecScalar>(k + (j - i), load<VecScalar, G>(s[int(Operand::Grad)], j));
  // A short tail is cheaper element by element than staged.
  if (end - i >= V::W / 4) {
    apply_tail<Rule, V, G, P16>(s, i, end - i, c, masked, when, vm1, vm2);
    return;
  }
  for (; i < end; ++i) apply_at<Rule, VecScalar, G, P16>(s, i, c, masked, when, mul1, mul2);
}

// Elements [b, e) of the streams; with block_sums (only for rules that read
// the gradient), [b, e) are whole sum blocks of the tensor (b a multiple of
// kSumBlock) and block_sums[j] receives the sum of squares of the gradient
// values of the j-th, in the order of math/sum_squares.hpp: what
// Kernels::transform with mul 1 sums for them.
template <class Rule, class V, DType G, DType P16>
void rule_range(void* const* s, int64_t b, int64_t e, const typename Rule::Consts& c, float mul1,
                float mul2, double* block_sums) {
  if constexpr (kRuleReadsGrad<Rule>) {
    if (block_sums) {
      for (; b < e; b += kSumBlock) {
        LaneSums sums;
        rule_run<Rule, V, G, P16, true>(s, b, std::min(e, b + kSumBlock), c, mul1, mul2, &sums);
        *block_sums++ = sums.total();
      }
      return;
    }
  }
  rule_run<Rule, V, G, P16, false>(s, b, e, c, mul1, mul2);
}

// The 16-bit parameter's dtype, for rules that write the parameter.
template <class Rule, class V, DType G>
void rule_range_g(const UpdateSlot& slot, int64_t b, int64_t e, const typename Rule::Consts& c,
                  float m1, float m2, double* sums) {
  void* const* s = slot.streams;
  if constexpr (!kRuleWritesParam<Rule>) rule_range<Rule, V, G, DType::F32>(s, b, e, c, m1, m2, sums);
  else if (!slot.data(Operand::Param16)) rule_range<Rule, V, G, DType::F32>(s, b, e, c, m1, m2, sums);
  else if (slot.param16_dtype == DType::F16) rule_range<Rule, V, G, DType::F16>(s, b, e, c, m1, m2, sums);
  else rule_range<Rule, V, G, DType::BF16>(s, b, e, c, m1, m2, sums);
}

// The gradient's dtype, for rules that read the gradient.
template <class Rule, class V>
void rule_range_r(const UpdateSlot& s, int64_t b, int64_t e, const typename Rule::Consts& c,
                  float m1, float m2, double* sums) {
  if constexpr (!kRuleReadsGrad<Rule>) {
    rule_range_g<Rule, V, DType::F32>(s, b, e, c, m1, m2, sums);
  } else {
    switch (s.grad_dtype) {
      case DType::F32: return rule_range_g<Rule, V, DType::F32>(s, b, e, c, m1, m2, sums);
      case DType::F16: return rule_range_g<Rule, V, DType::F16>(s, b, e, c, m1, m2, sums);
      case DType::BF16: return rule_range_g<Rule, V, DType::BF16>(s, b, e, c, m1, m2, sums);
    }
  }
}

// `rule` over elements [b, e) of one slot (block_sums: see rule_range).
template <class V>
void update_range(UpdateRule rule, const UpdateSlot& s, int64_t b, int64_t e, const void* c,
                  float m1, float m2, double* block_sums) {
  switch (rule) {
#define DSOPT_RULE_CASE(name, functor)                                                        \
  case UpdateRule::name:                                                                     \
    return rule_range_r<functor, V>(s, b, e, *static_cast<const typename functor::Consts*>(c), \
                                    m1, m2, block_sums);
    DSOPT_UPDATE_RULES(DSOPT_RULE_CASE)
#undef DSOPT_RULE_CASE
  }
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
