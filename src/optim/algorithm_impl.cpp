#include "optim/algorithm_impl.hpp"

#include "base/error.hpp"

namespace dsopt {
namespace {

// averaged(i) of every parameter, for the step pipeline.
std::vector<uint8_t> averaged_flags(const AlgorithmImpl& a, int64_t count) {
  std::vector<uint8_t> average(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) average[size_t(i)] = a.averaged(i) ? 1 : 0;
  return average;
}

}  // namespace

PreparedGrads AlgorithmImpl::prepare(const dsopt_tensor* grads, int64_t count) {
  return parts_.pipeline().prepare(grads, count, averaged_flags(*this, parts_.params().count()),
                                   update_sums());
}

void AlgorithmImpl::open_handover(int micro_batches) {
  parts_.pipeline().open_handover(averaged_flags(*this, parts_.params().count()), micro_batches);
}

void AlgorithmImpl::set_momentum_mask(int64_t, const dsopt_tensor*) {
  fail(DSOPT_EUNSUPPORTED, "dsopt_set_momentum_mask: " + blob_name() +
                               " has no momentum mask (only the 1-bit optimizers do)");
}

}  // namespace dsopt
