#include "algorithms/moment_rules/replicated_optimizer.hpp"

#include "base/error.hpp"
#include "zero/moment_shards.hpp"

namespace dsopt {

ReplicatedOptimizer::ReplicatedOptimizer(OptimizerParts& parts)
    : AlgorithmImpl(parts),
      rule_(moment_rule(parts.config())),
      moments_(parts.params(), parts.kernels(), parts.config().algorithm->moments) {
  if (rule_ == MomentRule::Lamb) u_ = DeviceBuffer(parts_.kernels(), size_t(parts_.params().total_numel()) * 4);
}

UpdateOutcome ReplicatedOptimizer::update(const PreparedGrads& grads) {
  const std::vector<UpdateSlot>& all = moments_.all_slots(parts_.params(), grads);
  const auto param_of = [](size_t k) { return int64_t(k); };
  if (rule_ != MomentRule::Lamb) {
    return UpdateOutcome{false, update_moments(parts_, rule_, all, param_of, grads, nullptr)};
  }
  std::vector<UpdateSlot> slots = all;
  for (size_t i = 0; i < slots.size(); ++i)
    slots[i].set(Operand::U, u_.floats() + parts_.params().params()[i].offset);
  update_moments(parts_, rule_, slots, param_of, grads,
                 shard_summed(whole_tensors(parts_.kernels()), parts_.shards()));
  return UpdateOutcome{};
}

void ReplicatedOptimizer::describe_state(StateSchema& s) {
  s.check([](const BlobReader& r) {
    if (r.has(kZeroLayoutSection))
      fail(DSOPT_EMISMATCH, "the blob is one rank's ZeRO shard: load all blobs of that run with "
                            "dsopt_state_load_shards");
  });
  moments_.describe(s, parts_.flat_slices());
}

std::function<void()> ReplicatedOptimizer::reshard(const Blobs& blobs) {
  auto state = std::make_shared<HostMomentState>(assemble_moment_state(
      blobs, parts_.params().shapes(), replicated_state_layout(parts_.params().shapes()),
      parts_.config().algorithm->moments));
  std::shared_ptr<const BlobReader> first = blobs[0];
  return [this, state, first] {
    parts_.restore_common(*first);
    parts_.restore_masters(state->masters.data());
    write_param_values(*state, parts_.params(), parts_.kernels());
    parts_.kernels().copy_from_host(moments_.exp_avg(), state->m.data(), state->m.size() * 4);
    if (moments_.exp_avg_sq())
      parts_.kernels().copy_from_host(moments_.exp_avg_sq(), state->v.data(), state->v.size() * 4);
  };
}

}  // namespace dsopt
