// 1-bit LAMB (docs/design/onebit-lamb.md, decisions.md G2, L1-L4, S1, K1-K2): LAMB
// without bias correction and with an EMA of each tensor's trust ratio for
// a warmup, then frozen variance and trust ratio, and every momentum in one
// fused buffer averaged through the 1-bit compressed allreduce.
#pragma once
#include <memory>
#include <vector>

#include "optim/moments.hpp"
#include "algorithms/lamb/lamb_step.hpp"
#include "algorithms/onebit/onebit_base.hpp"

namespace dsopt {

class OneBitLamb final : public OneBitOptimizer {
 public:
  explicit OneBitLamb(OptimizerParts& parts);

 protected:
  std::string blob_name() const override { return "OneBitLamb"; }
  bool averaged(int64_t) const override { return !stage().compressing; }
  UpdateOutcome update(const PreparedGrads& grads) override;
  std::string divergence_hint() const override { return stage_divergence_hint("lr or max_coeff"); }
  void describe_state(StateSchema& s) override;
  // vf and the scaling coefficients.
  void freeze_state() override;

 private:
  // One slot per parameter, slot.group = its index (constants are per tensor).
  std::vector<UpdateSlot> slots(const PreparedGrads* grads) const;
  LambStepConsts consts() const;
  void warmup(const PreparedGrads& grads);
  // The compression stage. The stabilized rule (update_units(): the
  // config's stabilize, or a loaded blob's): the momentum compressed in the
  // update's units, and the larger of LAMB's trust ratio ||p|| / ||u|| and
  // the frozen coefficient times factor; otherwise DeepSpeed's scaling
  // coefficients and the frozen coefficient times factor.
  void compressed(const PreparedGrads& grads);
  // The largest ratio of every tensor (over the shard group where the
  // parameters are shards).
  std::vector<float> max_ratios(const std::vector<UpdateSlot>& s) const;
  int64_t tail() const { return padded_ - parts_.params().total_numel(); }

  int64_t padded_;  // the fused buffer's length n' at this world size (L3)
  Moments moments_;  // m is the fused buffer, padding tail included (L4)
  DeviceBuffer fresh_;  // vf
  DeviceBuffer u_, aux_, ratio_;  // per-step scratch, numel each
  std::vector<double> coeff_freeze_, last_factor_, scaling_;  // per tensor
};

}  // namespace dsopt
