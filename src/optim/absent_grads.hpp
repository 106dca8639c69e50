// Absent gradients (dsopt_step with a gradient whose data is NULL): each
// is pointed at fp32 zeros, and the parameters absent on every rank are
// left out of the step where the algorithm skips them (Adam/AdamW: state
// and step count stay).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/rank_agreement.hpp"
#include "dsopt.h"
#include "kernels/device_buffer.hpp"
#include "kernels/kernels.hpp"
#include "params/param_set.hpp"

namespace dsopt {

class AbsentGrads {
 public:
  // Both outlive this object.
  AbsentGrads(Kernels& kernels, const ParamSet& params) : kernels_(kernels), params_(params) {}

  // dsopt_step's gradients with absent ones (NULL data) pointed at zeros;
  // `present` gets 1 per parameter with a gradient. Returns `grads` itself
  // when they do not describe every parameter (the pipeline rejects them).
  // Valid until the next call.
  const dsopt_tensor* fill(const dsopt_tensor* grads, int64_t count, std::vector<uint8_t>& present);
  // Sets inactive() from every rank's `present` (collective when `someone`
  // has absent gradients and the algorithm `skips` them).
  void agree(bool someone, bool skips, std::vector<uint8_t> present, RankAgreement& agreement);
  // This step: 1 for each parameter absent on every rank (empty: none).
  const std::vector<uint8_t>& inactive() const { return inactive_; }
  void clear() { inactive_.clear(); }

 private:
  Kernels& kernels_;
  const ParamSet& params_;
  std::vector<uint8_t> inactive_;
  DeviceBuffer zeros_;                // fp32 zeros standing in for absent gradients
  std::vector<dsopt_tensor> filled_;  // the gradients with zeros for absent ones
};

}  // namespace dsopt
