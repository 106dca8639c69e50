// Adam, AdamW and LAMB with replicated state (ZeRO stage 0; docs/design/adam.md,
// decisions.md A1/A2, docs/optimizers/lamb.md): every rank averages every
// gradient and keeps fp32 moments of every parameter; the moment rule
// (algorithms/moment_rules/moment_rule.hpp) updates whole tensors.
#pragma once
#include "algorithms/moment_rules/moment_rule.hpp"
#include "optim/moments.hpp"
#include "optim/algorithm_impl.hpp"

namespace dsopt {

class ReplicatedOptimizer final : public AlgorithmImpl {
 public:
  explicit ReplicatedOptimizer(OptimizerParts& parts);

 protected:
  std::string blob_name() const override { return moment_algorithm(parts_.config()); }
  UpdateOutcome update(const PreparedGrads& grads) override;
  // Adam leaves parameters without a gradient alone; LAMB steps them with
  // a zero gradient, as 1-bit LAMB does.
  bool skips_absent() const override { return rule_ != MomentRule::Lamb; }
  bool update_sums() const override { return rule_ != MomentRule::Lamb; }
  void describe_state(StateSchema& s) override;
  std::function<void()> reshard(const Blobs& blobs) override;

 private:
  MomentRule rule_;
  Moments moments_;
  DeviceBuffer u_;  // LAMB's direction, per step
};

}  // namespace dsopt
