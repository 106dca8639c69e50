#include "optim/replication_check.hpp"

#include <algorithm>

#include "base/fnv.hpp"
#include "params/param_set.hpp"

namespace dsopt {
namespace {

// splitmix64's finalizer: the per-gradient hashes are summed, so each
// should look uniformly random.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Whether some element of `bytes` (elements of `size` bytes, little-endian)
// is not zero; -0 counts as zero.
bool any_nonzero(const std::vector<uint8_t>& bytes, size_t size) {
  for (size_t i = 0; i < bytes.size(); ++i)
    if ((bytes[i] & (i % size == size - 1 ? 0x7F : 0xFF)) != 0) return true;
  return false;
}

}  // namespace

void ReplicationCheck::begin() {
  sum_ = 0;
  nonzero_ = false;
}

void ReplicationCheck::add(int64_t index, const dsopt_tensor& grad) {
  const size_t bytes = size_t(grad.numel) * dtype_size(DType(grad.dtype));
  sample_ends(kernels_, grad.data, bytes, first_, last_);
  uint64_t h = fnv1a(&index, sizeof index);
  h = fnv1a(&grad.dtype, sizeof grad.dtype, h);
  h = fnv1a(&grad.numel, sizeof grad.numel, h);
  h = fnv1a(first_.data(), first_.size(), h);
  h = fnv1a(last_.data(), last_.size(), h);
  sum_ += mix(h);
  const size_t size = dtype_size(DType(grad.dtype));
  nonzero_ = nonzero_ || any_nonzero(first_, size) || any_nonzero(last_, size);
}

bool ReplicationCheck::agree(RankAgreement& agreement) {
  // 0 stands for "all zeros"; every rank takes part whatever it holds.
  const uint64_t mine = nonzero_ ? std::max<uint64_t>(sum_, 1) : 0;
  return agreement.all_same(mine) && mine != 0;
}

bool ReplicationCheck::check_step(const ParamSet& params, const dsopt_tensor* grads, int64_t count,
                                  RankAgreement& agreement) {
  if (count >= 0) {
    begin();
    // Absent gradients and those that do not fit (the step rejects them)
    // are left out.
    for (int64_t i = 0; grads && count == params.count() && i < count; ++i)
      if (params.check_grad(i, grads[i], "grad").empty()) add(i, grads[i]);
  }
  return agree(agreement);
}

}  // namespace dsopt
