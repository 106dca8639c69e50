// Adam, AdamW and LAMB with replicated state (ZeRO stage 0; docs/design/adam.md,
// decisions.md A1/A2, docs/optimizers/lamb.md): every rank averages every
// gradient and keeps fp32 moments of every parameter; the moment rule
// (optim/moment_rule.hpp) updates whole tensors.
#pragma once
#include "optim/moment_rule.hpp"
#include "optim/moments.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

class ReplicatedOptimizer final : public Optimizer {
 public:
  ReplicatedOptimizer(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                      const dsopt_tensor* params, int64_t count);

 protected:
  std::string algorithm() const override { return moment_algorithm(config()); }
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
