// 1-bit LAMB (docs/design/onebit-lamb.md, decisions.md G2, L1-L4, S1, K1-K2): LAMB
// without bias correction and with an EMA of each tensor's trust ratio for
// a warmup, then frozen variance and trust ratio, and every momentum in one
// fused buffer averaged through the 1-bit compressed allreduce.
#pragma once
#include <memory>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "onebit/car_errors.hpp"
#include "onebit/freeze_stage.hpp"
#include "optim/moments.hpp"
#include "onebit/momentum_masks.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

class OneBitLamb final : public Optimizer {
 public:
  OneBitLamb(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
             const dsopt_tensor* params, int64_t count);
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) override {
    masks_.set(kernels(), params(), param_index, mask);
  }

 protected:
  std::string algorithm() const override { return "OneBitLamb"; }
  bool averaged(int64_t) const override { return !stage_.compressing; }
  bool update(const PreparedGrads& grads) override;
  std::string divergence_hint() const override;
  void describe_state(StateSchema& s) override;
  // The stage a loaded blob resumes in (after its sections are checked).
  void resume_stage(const BlobReader& r);
  std::string rank_local_state(const BlobReader& r) const override;

 private:
  // One slot per parameter, slot.group = its index (constants are per tensor).
  std::vector<UpdateSlot> slots(const PreparedGrads* grads) const;
  LambStepConsts consts() const;
  void warmup(const PreparedGrads& grads);
  void compressed(const PreparedGrads& grads);
  void enter_compression(int64_t warmup_updates);
  void start_compressed_allreduce();
  int64_t tail() const { return padded_ - params().total_numel(); }

  FreezeStage stage_;
  int64_t padded_;  // the fused buffer's length n' at this world size (L3)
  Moments moments_;  // m is the fused buffer, padding tail included (L4)
  DeviceBuffer fresh_;  // vf
  DeviceBuffer u_, aux_, ratio_;  // per-step scratch, numel each
  std::vector<double> coeff_freeze_, last_factor_, scaling_;  // per tensor
  MomentumMasks masks_;
  CarErrors errors_;  // of the one fused tensor
  std::unique_ptr<CompressedAllreduce> car_;  // in the compression stage with P > 1
  // The stabilized compression stage's rule (the config's stabilize, or a
  // loaded blob's): the momentum compressed in the update's units, and the
  // larger of LAMB's trust ratio ||p|| / ||u|| and the frozen coefficient
  // times factor; otherwise DeepSpeed's scaling coefficients and the frozen
  // coefficient times factor.
  bool update_units_;
};

}  // namespace dsopt
