// 1-bit Adam (docs/optimizers/onebit-adam.md "1-bit Adam"): Adam for a warmup, then frozen
// variance and momentum averaged through the 1-bit compressed allreduce.
#pragma once
#include <memory>
#include <vector>

#include "optim/moments.hpp"
#include "algorithms/onebit/onebit_base.hpp"

namespace dsopt {

class OneBitAdam final : public OneBitOptimizer {
 public:
  explicit OneBitAdam(OptimizerParts& parts);
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) override;

 protected:
  std::string blob_name() const override { return "OneBitAdam"; }
  bool averaged(int64_t i) const override { return !stage().compressing || non_freeze(i); }
  UpdateOutcome update(const PreparedGrads& grads) override;
  std::string divergence_hint() const override { return stage_divergence_hint("lr"); }
  void describe_state(StateSchema& s) override;

 private:
  bool non_freeze(int64_t i) const;
  std::vector<OneBitConsts> consts() const;

  Moments moments_;
  // The compressed allreduce runs over the compressed parameters, in order.
  std::vector<int64_t> compressed_;  // parameters whose momentum is compressed
  std::vector<int64_t> full_;        // parameters of non_freeze groups
};

}  // namespace dsopt
