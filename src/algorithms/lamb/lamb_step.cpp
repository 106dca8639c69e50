#include "algorithms/lamb/lamb_step.hpp"

#include <utility>

namespace dsopt {

std::vector<double> whole_tensor_sums(Kernels& kernels, const std::vector<UpdateSlot>& slots,
                                      std::initializer_list<Operand> streams) {
  std::vector<TensorRef> refs;
  for (Operand o : streams)
    for (const UpdateSlot& slot : slots) refs.push_back(TensorRef{slot.data(o), slot.numel, DType::F32});
  std::vector<double> sums(refs.size(), 0.0);
  kernels.transform(refs.data(), int64_t(refs.size()), 1.0f, nullptr, sums.data());
  return sums;
}

TensorSums whole_tensors(Kernels& kernels) {
  return [&kernels](const std::vector<UpdateSlot>& s, std::initializer_list<Operand> streams) {
    return whole_tensor_sums(kernels, s, streams);
  };
}

TensorSums shard_summed(TensorSums local, const ShardGroup& shards) {
  if (!shards.active()) return local;
  return [local = std::move(local), &shards](const std::vector<UpdateSlot>& s,
                                             std::initializer_list<Operand> streams) {
    std::vector<double> sums = local(s, streams);
    shards.sum(sums);
    return sums;
  };
}

std::vector<double> lamb_step(Kernels& kernels, const std::vector<UpdateSlot>& slots,
                              std::vector<LambConsts>& consts, const std::vector<double>& lr,
                              float mul1, float mul2, const LambCoeffConfig& k,
                              const TensorSums& sums) {
  const size_t n = consts.size();
  kernels.update(UpdateRule::LambWarmup, slots.data(), int64_t(slots.size()), consts.data(),
                 int32_t(n), mul1, mul2);
  const std::vector<double> s = sums(slots, {Operand::Param, Operand::U});
  std::vector<double> coeff(n);
  for (size_t i = 0; i < n; ++i) coeff[i] = lamb_warmup_coeff(s[i], s[n + i], k);
  lamb_move(kernels, slots, consts, lr, coeff);
  return coeff;
}

void lamb_move(Kernels& kernels, const std::vector<UpdateSlot>& slots,
               std::vector<LambConsts>& consts, const std::vector<double>& lr,
               const std::vector<double>& coeff) {
  for (size_t i = 0; i < consts.size(); ++i) consts[i].step_size = float(-lr[i] * coeff[i]);
  kernels.update(UpdateRule::LambApply, slots.data(), int64_t(slots.size()), consts.data(),
                 int32_t(consts.size()), 1.0f, 1.0f);
}

}  // namespace dsopt
