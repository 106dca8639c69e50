// launch_update: every rule of math/update_rules.hpp through the one
// functor (update_kernel.cuh). Slots are grouped by what the functor's code
// depends on (16-bit parameter dtype for rules that write the parameter,
// gradient dtype for rules that read it), one multi-tensor launch sequence
// per combination present.
#include <vector>

#include "base/error.hpp"
#include "launch.hpp"
#include "multi_tensor_apply.cuh"
#include "update_kernel.cuh"

namespace dsopt {
namespace cuda {
namespace {

template <class Rule>
using UpdateEntry = TensorListEntry<kUpdateDepth<Rule>>;

template <class Rule, DType Param16, DType Grad>
void run(cudaStream_t stream, const std::vector<UpdateEntry<Rule>>& list,
         const typename Rule::Consts* consts, float mul1, float mul2) {
  if (list.empty()) return;
  const UpdateFunctor<Rule, Param16, Grad> f{consts, mul1, mul2};
  multi_tensor_apply<kUpdateDepth<Rule>>(stream, kUpdateThreads, kUpdateChunk, list.data(),
                                         static_cast<int64_t>(list.size()), f);
}

int dtype_index(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 2; }

// lists[param16: none, f16, bf16][grad: f32, f16, bf16]
template <class Rule>
using Lists = std::vector<UpdateEntry<Rule>>[3][3];

template <class Rule, DType Param16>
void run_grads(cudaStream_t stream, const Lists<Rule>& lists, const typename Rule::Consts* consts,
               float mul1, float mul2) {
  const int p = dtype_index(Param16);
  run<Rule, Param16, DType::F32>(stream, lists[p][0], consts, mul1, mul2);
  if constexpr (kRuleReadsGrad<Rule>) {
    run<Rule, Param16, DType::F16>(stream, lists[p][1], consts, mul1, mul2);
    run<Rule, Param16, DType::BF16>(stream, lists[p][2], consts, mul1, mul2);
  }
}

template <class Rule>
void launch_rule(cudaStream_t stream, const UpdateSlot* slots, int64_t count,
                 const typename Rule::Consts* consts, float mul1, float mul2) {
  constexpr bool grad = kRuleReadsGrad<Rule>;
  constexpr bool param = kRuleWritesParam<Rule>;
  Lists<Rule> lists;
  for (int64_t i = 0; i < count; ++i) {
    const UpdateSlot& s = slots[i];
    const bool half = s.data(Operand::Param16) != nullptr;
    if (half && s.param16_dtype == DType::F32)
      fail(DSOPT_EINTERNAL, "update: 16-bit parameter copy with dtype float32");
    const int p = param && half ? dtype_index(s.param16_dtype) : 0;
    const int g = grad ? dtype_index(s.grad_dtype) : 0;
    UpdateEntry<Rule> e{};
    for (int o = 0; o < kOperandCount; ++o)
      if (kRuleStreams<Rule> & (OperandSet(1) << o)) e.addr[update_addr<Rule>(o)] = s.streams[o];
    e.numel = s.numel;
    e.tag = s.group;
    lists[p][g].push_back(e);
  }
  if (!grad) { mul1 = 1.0f; mul2 = 1.0f; }
  run_grads<Rule, DType::F32>(stream, lists, consts, mul1, mul2);
  if constexpr (param) {
    run_grads<Rule, DType::F16>(stream, lists, consts, mul1, mul2);
    run_grads<Rule, DType::BF16>(stream, lists, consts, mul1, mul2);
  }
}

}  // namespace

void launch_update(cudaStream_t stream, UpdateRule rule, const UpdateSlot* slots, int64_t count,
                   const void* consts_dev, float mul1, float mul2) {
  switch (rule) {
#define DSOPT_RULE_CASE(name, functor)                                                          \
  case UpdateRule::name:                                                                       \
    return launch_rule<functor>(stream, slots, count,                                          \
                                static_cast<const typename functor::Consts*>(consts_dev), mul1, \
                                mul2);
    DSOPT_UPDATE_RULES(DSOPT_RULE_CASE)
#undef DSOPT_RULE_CASE
  }
  fail(DSOPT_EINTERNAL, "update: unknown rule");
}

}  // namespace cuda
}  // namespace dsopt
