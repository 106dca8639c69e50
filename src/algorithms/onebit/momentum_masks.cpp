#include "algorithms/onebit/momentum_masks.hpp"

#include <string>

#include "base/error.hpp"

namespace dsopt {

void MomentumMasks::set(Kernels& kernels, const ParamSet& params, int64_t i, const dsopt_tensor* mask) {
  const std::string who = "dsopt_set_momentum_mask: ";
  if (i < 0 || i >= params.count())
    fail(DSOPT_EINVAL, who + "param_index " + std::to_string(i) + " is out of range (the optimizer has " +
                           std::to_string(params.count()) + " parameters)");
  if (!mask) {
    masks_[size_t(i)] = DeviceBuffer();
    return;
  }
  const Param& p = params.params()[size_t(i)];
  if (!mask->data) fail(DSOPT_EINVAL, who + "mask->data is NULL");
  if (mask->numel != p.numel)
    fail(DSOPT_EINVAL, who + "mask has numel " + std::to_string(mask->numel) + ", parameter " +
                           std::to_string(i) + " has " + std::to_string(p.numel));
  if (mask->dtype != DSOPT_FLOAT32) fail(DSOPT_EINVAL, who + "mask must have dtype DSOPT_FLOAT32");
  const bool on_device = is_cuda_device_pointer(mask->data);
  if (kernels.device() == Device::Cuda && !on_device)
    fail(DSOPT_EINVAL, who + "mask must be CUDA device memory (the optimizer's device is cuda)");
  if (kernels.device() == Device::Cpu && on_device)
    fail(DSOPT_EINVAL, who + "mask is CUDA device memory but the optimizer's device is cpu");
  DeviceBuffer copy(kernels, size_t(p.numel) * 4);
  kernels.copy(copy.get(), mask->data, copy.bytes());
  masks_[size_t(i)] = std::move(copy);
}

std::vector<const float*> MomentumMasks::pointers() const {
  std::vector<const float*> out;
  for (const DeviceBuffer& m : masks_) out.push_back(m.floats());
  return out;
}

}  // namespace dsopt
