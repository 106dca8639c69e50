// Momentum masks of the 1-bit optimizers (DeepSpeed's exp_avg_mask,
// DECISIONS O2): one optional fp32 tensor per parameter, set through
// dsopt_set_momentum_mask, copied into the optimizer's device memory, never
// part of the state blob.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "kernels/device_buffer.hpp"
#include "optim/param_set.hpp"

namespace dsopt {

class MomentumMasks {
 public:
  explicit MomentumMasks(int64_t count) : masks_(size_t(count)) {}

  // Validates `mask` for parameter i (throws Error(DSOPT_EINVAL), nothing
  // changes) and keeps a copy; nullptr clears. `refusal(i)`, when not
  // empty, says why parameter i takes no mask.
  void set(const ParamSet& params, Kernels& kernels, int64_t i, const dsopt_tensor* mask,
           const std::function<std::string(int64_t)>& refusal = nullptr);

  // Per parameter: the mask's device pointer, or nullptr.
  std::vector<const float*> pointers() const;

 private:
  std::vector<DeviceBuffer> masks_;
};

}  // namespace dsopt
