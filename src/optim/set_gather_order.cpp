// dsopt_gather_order: the ranks agree on the order in which the deferred
// parameter allgather posts its buckets (optim/gather_order.hpp) before any
// of them uses it, since every rank must post the same collectives in the
// same sequence.
#include "base/error.hpp"
#include "comm/rank_agreement.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

void Optimizer::set_gather_order(const int64_t* order, int64_t count) {
  const char* const call = "dsopt_gather_order";
  refuse_while_handing_over(call);
  enter_collective(Call::GatherOrder);
  const std::string bad = GatherOrder::check(order, count, params_.count());
  const LocalOutcome mine =
      LocalOutcome::invalid_if(bad.empty() ? "" : std::string(call) + ": " + bad + " (nothing was changed)");
  const bool valid = bad.empty();
  const std::vector<int64_t> row = {
      int64_t(valid ? GatherOrder::fingerprint(order, count, params_.count()) : 0)};
  const std::vector<std::vector<int64_t>> rows = agreement_.gather(
      Failure{call, "passed an order that is not a permutation of the parameters"}, mine, row);
  RankAgreement::require_same(
      call, rows, {{0, "the gather order", "passed different orders; nothing was changed"}});
  gathers_.order().set(order, count, num_gather_chunks(),
                    [this](int64_t i) { return gather_chunks_of(i); });
}

}  // namespace dsopt
