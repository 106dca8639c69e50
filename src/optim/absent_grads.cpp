#include "optim/absent_grads.hpp"

#include <algorithm>

namespace dsopt {

const dsopt_tensor* AbsentGrads::fill(const dsopt_tensor* grads, int64_t count,
                                      std::vector<uint8_t>& present) {
  present.assign(size_t(params_.count()), 1);
  if (!grads || count != params_.count()) return grads;
  int64_t largest = 0;
  for (int64_t i = 0; i < count; ++i)
    if (!grads[i].data) {
      present[size_t(i)] = 0;
      largest = std::max(largest, params_.params()[size_t(i)].numel);
    }
  if (largest == 0) return grads;
  if (zeros_.bytes() < size_t(largest) * 4) {
    zeros_ = DeviceBuffer(kernels_, size_t(largest) * 4);
    kernels_.fill_zero(zeros_.get(), zeros_.bytes());
  }
  filled_.assign(grads, grads + count);
  for (int64_t i = 0; i < count; ++i)
    if (!present[size_t(i)])
      filled_[size_t(i)] = dsopt_tensor{zeros_.get(), params_.params()[size_t(i)].numel,
                                        DSOPT_FLOAT32, 0};
  return filled_.data();
}

void AbsentGrads::agree(bool someone, bool skips, std::vector<uint8_t> present,
                        RankAgreement& agreement) {
  inactive_.clear();
  if (!someone || !skips) return;
  agreement.any_rank(present);
  inactive_.resize(present.size());
  for (size_t i = 0; i < present.size(); ++i) inactive_[i] = present[i] ? 0 : 1;
}

}  // namespace dsopt
