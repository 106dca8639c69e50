// Momentum masks of the 1-bit optimizers (dsopt_set_momentum_mask, docs/design/decisions.md
// O2): one optional fp32 copy per parameter in the optimizer's device
// memory, applied after decompression, never saved in a blob.
#pragma once
#include <cstdint>
#include <vector>

#include "dsopt.h"
#include "kernels/device_buffer.hpp"
#include "params/param_set.hpp"

namespace dsopt {

class MomentumMasks {
 public:
  explicit MomentumMasks(int64_t count) : masks_(size_t(count)) {}

  // Validates `mask` against parameter i (range, numel, dtype, device; throws
  // Error(DSOPT_EINVAL) and changes nothing) and keeps a copy; nullptr clears.
  void set(Kernels& kernels, const ParamSet& params, int64_t i, const dsopt_tensor* mask);

  // Per parameter, nullptr where none is set.
  std::vector<const float*> pointers() const;

 private:
  std::vector<DeviceBuffer> masks_;
};

}  // namespace dsopt
