// 0/1 Adam (docs/design/zero-one-adam.md, decisions.md G2, Z1-Z2, S1, K1-K2):
// variance updates on full-precision steps at growing intervals, 1-bit
// gradient steps between them, then frozen variance, local steps and 1-bit
// syncs of the lr-weighted accumulator at growing intervals.
#pragma once
#include <memory>
#include <vector>

#include "optim/moments.hpp"
#include "algorithms/onebit/onebit_base.hpp"

namespace dsopt {

class ZeroOneAdam final : public OneBitOptimizer {
 public:
  explicit ZeroOneAdam(OptimizerParts& parts);

  // The schedules of docs/design/zero-one-adam.md section 3, on DeepSpeed's counter k (G2).
  struct Schedule {
    int32_t frozen = 0;            // phase 2: v frozen, local steps and syncs
    int64_t var_interval = 1;
    int64_t var_counter = 0;
    int64_t local_interval = 1;
    int64_t local_counter = 0;
    int64_t variance_updates = 0;  // K: full steps so far (the stabilized bound's K)
  };

 protected:
  std::string blob_name() const override { return "ZeroOneAdam"; }
  bool averaged(int64_t) const override;
  UpdateOutcome update(const PreparedGrads& grads) override;
  int32_t step_phase(bool compressed) const override { (void)compressed; return phase_; }
  std::string divergence_hint() const override;
  void describe_state(StateSchema& s) override;

 private:
  const ZeroOneSettings& zero_one() const { return parts_.config().settings_as<ZeroOneSettings>(); }
  std::vector<ZeroOneConsts> consts(bool clamp) const;
  std::vector<UpdateSlot> slots(const PreparedGrads* grads) const;
  void variance_phase_step(const PreparedGrads& grads, int64_t k);
  void local_phase_step(const PreparedGrads& grads, int64_t k);
  void sync(const std::vector<UpdateSlot>& slots);
  void freeze();
  void reset_interval();  // lrs and decay back to "nothing since the last sync"
  // The accumulator and the interval start over from the current
  // parameters, as after a sync.
  void restart_interval();

  Schedule sched_;
  int32_t phase_ = DSOPT_PHASE_SKIPPED;
  Moments moments_;
  DeviceBuffer acc_;     // accumulator (phase 2); staged gradients of 1-bit steps (phase 1)
  DeviceBuffer anchor_;  // parameters at the last sync (phase 2)
  std::vector<double> lrs_;    // per group: sum of lr since the last sync
  std::vector<double> decay_;  // per group: prod (1 - lr wd) since it (decoupled_sync_weight_decay)
  // The compressed allreduce (P > 1) averages gradients (phase 1) and
  // accumulators (phase 2), in the update's units with update_units().
};

}  // namespace dsopt
