#include "optim/shard_group.hpp"

#include <cstdint>

namespace dsopt {

ShardGroup::ShardGroup(Comm& comm)
    : main_(comm),
      shards_(comm.given_shards() && comm.given_shards()->size() > 1 ? comm.given_shards()
                                                                      : nullptr) {}

Comm* ShardGroup::comm() const {
  if (!shards_) return nullptr;
  shards_->prepare();
  shards_->set_timeout(main_.timeout());
  return shards_;
}

void ShardGroup::sum(std::vector<double>& values) const {
  if (shards_ && !values.empty())
    comm()->allreduce(values.data(), values.data(), values.size(), Elem::F64, ReduceOp::Sum,
                       Mem::host());
}

void ShardGroup::max(std::vector<float>& values) const {
  if (shards_ && !values.empty())
    comm()->allreduce(values.data(), values.data(), values.size(), Elem::F32, ReduceOp::Max,
                       Mem::host());
}

bool ShardGroup::settle_step(const LocalOutcome& mine, bool nonfinite, double* sum) const {
  if (!shards_) return nonfinite;
  RankAgreement agreement(*comm(), Mem::host());
  return agreement.settle_sum(kStepFailure, mine, nonfinite, sum);
}

LocalOutcome ShardGroup::agree_valid(const LocalOutcome& mine) const {
  if (!shards_) return mine;
  int64_t failed = mine.ok() ? 0 : 1;
  comm()->allreduce(&failed, &failed, 1, Elem::I64, ReduceOp::Max, Mem::host());
  if (!mine.ok() || !failed) return mine;
  return LocalOutcome::failure(DSOPT_EMISMATCH,
                               "another rank of this rank's shard group (dsopt_comm_set_shards) "
                               "passed gradients that could not be used (see that rank's error); "
                               "no rank changed anything");
}

}  // namespace dsopt
