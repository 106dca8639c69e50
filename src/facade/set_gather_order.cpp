// The deferred parameter allgather as the C API sees it (dsopt_gather_*).
// dsopt_gather_order: the ranks agree on the order in which the deferred
// parameter allgather posts its buckets (optim/gather_order.hpp) before any
// of them uses it, since every rank must post the same collectives in the
// same sequence.
#include "base/error.hpp"
#include "comm/rank_agreement.hpp"
#include "facade/optimizer.hpp"
#include "facade/optimizer_impl.hpp"

namespace dsopt {

void Optimizer::set_gather_order(const int64_t* order, int64_t count) {
  Impl& s = *impl_;
  const char* const call = "dsopt_gather_order";
  s.refuse_while_handing_over(call);
  s.enter_collective(Impl::Call::GatherOrder);
  const int64_t num_params = s.parts.params().count();
  const std::string bad = GatherOrder::check(order, count, num_params);
  const LocalOutcome mine =
      LocalOutcome::invalid_if(bad.empty() ? "" : std::string(call) + ": " + bad + " (nothing was changed)");
  const bool valid = bad.empty();
  const std::vector<int64_t> row = {
      int64_t(valid ? GatherOrder::fingerprint(order, count, num_params) : 0)};
  const std::vector<std::vector<int64_t>> rows = s.parts.agreement().gather(
      Failure{call, "passed an order that is not a permutation of the parameters"}, mine, row);
  RankAgreement::require_same(
      call, rows, {{0, "the gather order", "passed different orders; nothing was changed"}});
  const AlgorithmImpl& algorithm = *s.algorithm;
  s.parts.gathers().order().set(order, count, algorithm.num_gather_chunks(),
                                [&algorithm](int64_t i) { return algorithm.gather_chunks_of(i); });
}

int64_t Optimizer::gather_buckets() const { return impl_->algorithm->num_gather_chunks(); }

int64_t Optimizer::gather_bucket_of(int64_t param_index) const {
  param_numel(param_index, nullptr);  // range check
  return impl_->parts.gathers().order().last_position(impl_->algorithm->gather_chunks_of(param_index));
}

int64_t Optimizer::gathers_pending() { return impl_->parts.gathers().gathers_pending(); }

void Optimizer::wait_gathers(int64_t bucket, const char* call) {
  impl_->parts.gathers().wait_gathers(bucket, call);
}

}  // namespace dsopt
