// The one update functor for the multi-tensor kernel, driven by the rule's
// declaration (math/update_rule.hpp) as the CPU loop is
// (src/kernels/cpu/update_loop.hpp): every element loads what the rule
// reads, runs its apply with ScalarOps and stores what it writes, so both
// give the same bits. A rule's tensor list holds only the streams it
// touches (kRuleStreams), so lists of rules with few streams carry more
// tensors per launch.
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "kernels/kernels.hpp"
#include "math/scalar_ops.hpp"
#include "math/update_rules.hpp"

namespace dsopt {
namespace cuda {

constexpr int kUpdateChunk = 65536;  // elements per block (docs/design/adam.md 2.6)
constexpr int kUpdateThreads = 512;
constexpr int kUpdateIlp = 4;  // elements in flight per thread

constexpr int count_operands(OperandSet s) {
  int n = 0;
  for (; s != 0; s &= s - 1) ++n;
  return n;
}

// Addresses per tensor in the rule's list, and operand O's place among them
// (the streams it touches, in Operand order).
template <class Rule>
constexpr int kUpdateDepth = count_operands(kRuleStreams<Rule>);
template <class Rule>
constexpr int update_addr(int operand) {
  return count_operands(kRuleStreams<Rule> & ((OperandSet(1) << operand) - 1));
}
template <class Rule, Operand O>
constexpr int kUpdateAddr = update_addr<Rule>(int(O));

// `Param16` is the dtype of the 16-bit parameter copy, or F32 for none;
// `Grad` the gradient's dtype (F32 for rules that read none).
template <class Rule, DType Param16, DType Grad>
struct UpdateFunctor {
  static constexpr int kDepth = kUpdateDepth<Rule>;

  const typename Rule::Consts* consts;  // device memory, indexed by the tensor's tag (group)
  float mul1, mul2;

  __device__ __forceinline__ void operator()(const TensorListMeta<kDepth>& meta, int t,
                                             int64_t chunk, int64_t chunk_size) const {
    void* s[kOperandCount];
    for_each_operand([&](auto o) {
      constexpr Operand O = decltype(o)::value;
      if constexpr ((kRuleStreams<Rule> & kOperandBit<O>) != 0)
        s[int(O)] = meta.addr[kUpdateAddr<Rule, O>][t];
      else
        s[int(O)] = nullptr;
    });
    const bool masked = kRuleReadsMask<Rule> && s[int(Operand::Mask)] != nullptr;
    const typename Rule::Consts c = consts[meta.tag[t]];
    const bool when = Rule::when(c, masked);
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    const int64_t stride = int64_t(blockDim.x) * kUpdateIlp;

    for (int64_t base = begin + threadIdx.x; base < end; base += stride) {
      // Zeroed, though lanes past the end are never used: without it ptxas
      // spills in the Adam and warmup variants under the 64-register bound.
      RuleElements<ScalarOps> e[kUpdateIlp] = {};
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i < end) load(e[k], s, i, masked, when);
      }
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i >= end) continue;
        if constexpr (kRuleReadsGrad<Rule>)
          e[k].g = ScalarOps::mul(ScalarOps::mul(e[k].g, mul1), mul2);
        Rule::apply(e[k], c);
        store(e[k], s, i, when);
      }
    }
  }

  // The operands the rule reads (the gradient unscaled: fp32 of its dtype).
  __device__ __forceinline__ static void load(RuleElements<ScalarOps>& e, void* const* s,
                                              int64_t i, bool masked, bool when) {
    e.masked = masked;
    for_each_operand([&](auto o) {
      constexpr Operand O = decltype(o)::value;
      const float* const x = static_cast<const float*>(s[int(O)]);
      if constexpr (O == Operand::Param16) {
      } else if constexpr ((Rule::kReads & kOperandBit<O>) != 0) {
        if constexpr (O == Operand::Grad) e.g = load_float<Grad>(s[int(O)], i);
        else if constexpr (O == Operand::Mask) e.mask = masked ? x[i] : 1.0f;
        else if constexpr (((Rule::kWrites | Rule::kWritesWhen) & kOperandBit<O>) == 0)
          e.template at<O>() = __ldg(x + i);  // read-only for this kernel
        else e.template at<O>() = x[i];
      } else if constexpr ((Rule::kReadsWhen & kOperandBit<O>) != 0) {
        e.template at<O>() = when ? x[i] : 0.0f;
      }
    });
  }

  // The operands the rule writes, the parameter (and its 16-bit copy) last,
  // the order that keeps register pressure lowest.
  __device__ __forceinline__ static void store(RuleElements<ScalarOps>& e, void* const* s,
                                               int64_t i, bool when) {
    for_each_operand([&](auto o) {
      constexpr Operand O = decltype(o)::value;
      float* const x = static_cast<float*>(s[int(O)]);
      if constexpr (O == Operand::Param16 || O == Operand::Param) {
      } else if constexpr ((Rule::kWrites & kOperandBit<O>) != 0) {
        x[i] = e.template at<O>();
      } else if constexpr ((Rule::kWritesWhen & kOperandBit<O>) != 0) {
        if (when) x[i] = e.template at<O>();
      }
    });
    if constexpr (kRuleWritesParam<Rule>) {
      static_cast<float*>(s[int(Operand::Param)])[i] = e.p;
      if constexpr (Param16 != DType::F32) store_float<Param16>(s[int(Operand::Param16)], i, e.p);
    }
  }
};

}  // namespace cuda
}  // namespace dsopt
