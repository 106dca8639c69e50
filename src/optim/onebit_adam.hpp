// 1-bit Adam (docs/optimizers/onebit-adam.md "1-bit Adam"): Adam for a warmup, then frozen
// variance and momentum averaged through the 1-bit compressed allreduce.
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

class OneBitAdam final : public Optimizer {
 public:
  OneBitAdam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
             const dsopt_tensor* params, int64_t count);
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) override;

 protected:
  std::string algorithm() const override { return "OneBitAdam"; }
  bool averaged(int64_t i) const override { return !stage_.compressing || non_freeze(i); }
  bool update(const PreparedGrads& grads) override;
  std::string divergence_hint() const override;
  void describe_state(StateSchema& s) override;
  // The stage a loaded blob resumes in (after its sections are checked).
  void resume_stage(const BlobReader& r);
  std::string rank_local_state(const BlobReader& r) const override;

 private:
  bool non_freeze(int64_t i) const;
  std::vector<OneBitConsts> consts() const;
  void enter_compression(int64_t warmup_updates);

  FreezeStage stage_;
  Moments moments_;
  std::vector<int64_t> compressed_;  // parameters whose momentum is compressed
  std::vector<int64_t> full_;        // parameters of non_freeze groups
  MomentumMasks masks_;
  CarErrors errors_;  // compressed tensors' error buffers in the blob
  std::unique_ptr<CompressedAllreduce> car_;  // in the compression stage with P > 1
  // Both moments bias-corrected, and the momentum compressed in the update's
  // units (the stabilized rule): the config's choice, or a loaded blob's.
  bool bias_correction_;
  bool update_units_;
};

}  // namespace dsopt
