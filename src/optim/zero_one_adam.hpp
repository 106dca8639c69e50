// 0/1 Adam (docs/design/zero-one-adam.md, decisions.md G2, Z1-Z2, S1, K1-K2):
// variance updates on full-precision steps at growing intervals, 1-bit
// gradient steps between them, then frozen variance, local steps and 1-bit
// syncs of the lr-weighted accumulator at growing intervals.
#pragma once
#include <memory>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "onebit/car_errors.hpp"
#include "optim/moments.hpp"
#include "onebit/momentum_masks.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

class ZeroOneAdam final : public Optimizer {
 public:
  ZeroOneAdam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
              const dsopt_tensor* params, int64_t count);
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) override;

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
  std::string algorithm() const override { return "ZeroOneAdam"; }
  bool averaged(int64_t) const override;
  bool update(const PreparedGrads& grads) override;
  int32_t step_phase(bool compressed) const override { (void)compressed; return phase_; }
  std::string divergence_hint() const override;
  void describe_state(StateSchema& s) override;
  std::string rank_local_state(const BlobReader& r) const override;

 private:
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
  MomentumMasks masks_;
  CarErrors errors_;
  std::unique_ptr<CompressedAllreduce> car_;  // P > 1: gradients (phase 1), accumulators (phase 2)
  // Both moments bias-corrected, and gradients and accumulators compressed
  // in the update's units (the stabilized rule): the config's choice, or a
  // loaded blob's.
  bool bias_correction_;
  bool update_units_;
};

}  // namespace dsopt
