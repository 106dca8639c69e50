#include "comm/rank_agreement.hpp"

#include <algorithm>
#include <cstddef>

namespace dsopt {

const Failure kStepFailure{"dsopt_step",
                           "passed gradients that could not be used or abandoned the step",
                           "no rank changed anything"};

void RankAgreement::settle(const Failure& failed, const LocalOutcome& mine, int64_t* flags,
                           int count) {
  if (comm_.size() == 1) {
    if (!mine.ok()) dsopt::fail(mine.status, failed.call + ": " + mine.error);
    return;
  }
  std::vector<int64_t> values(size_t(count) + 1);
  values[0] = mine.ok() ? 0 : 1;
  for (int i = 0; i < count; ++i) values[size_t(i) + 1] = flags[i];
  comm_.allreduce(values.data(), values.data(), values.size(), Elem::I64, ReduceOp::Max, host_);
  if (values[0] != 0) fail(failed, mine);
  for (int i = 0; i < count; ++i) flags[i] = values[size_t(i) + 1];
}

bool RankAgreement::settle_sum(const Failure& failed, const LocalOutcome& mine, bool nonfinite,
                               double* sum) {
  double control[2] = {status_value(mine.ok(), nonfinite), *sum};
  if (comm_.size() > 1)
    comm_.allreduce(control, control, 2, Elem::F64, ReduceOp::Sum, host_);
  if (some_rank_failed(control[0])) fail(failed, mine);
  *sum = control[1];
  return control[0] > 0.0;
}

bool RankAgreement::all_same(uint64_t value) {
  // The max of x and of ~x over ranks: the max and (as ~min) the min of x.
  int64_t v[2] = {int64_t(value), int64_t(~value)};
  if (comm_.size() > 1) comm_.allreduce(v, v, 2, Elem::I64, ReduceOp::Max, host_);
  return v[0] == ~v[1];
}

void RankAgreement::fail(const Failure& failed, const LocalOutcome& mine) {
  const int world = comm_.size();
  std::vector<int64_t> all(size_t(world), 0);
  int64_t flag = mine.ok() ? 0 : 1;
  comm_.allgather(&flag, all.data(), 1, Elem::I64, host_);
  if (!mine.ok()) dsopt::fail(mine.status, failed.call + ": " + mine.error);
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r)
    if (all[size_t(r)]) ranks.push_back(r);
  fail_for(failed, ranks);
}

void RankAgreement::fail_for(const Failure& failed, const std::vector<int>& failed_ranks) {
  std::string ranks;
  for (int r : failed_ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  dsopt::fail(DSOPT_EMISMATCH, failed.call + ": another rank failed: rank " + ranks + " " + failed.what +
                                   " (see that rank's error); " + failed.consequence);
}

void RankAgreement::fail_different_calls(const std::string& mine, const std::string& lowest,
                                         const std::string& highest) {
  dsopt::fail(DSOPT_EMISMATCH, "the ranks are not in the same dsopt call: this rank is in " + mine +
                                   ", and the ranks range from " + lowest + " to " + highest +
                                   "; every rank must make the same collective calls on an "
                                   "optimizer in the same order (nothing was changed)");
}

void RankAgreement::any_rank(std::vector<uint8_t>& flags) {
  if (comm_.size() > 1)
    comm_.allreduce(flags.data(), flags.data(), flags.size(), Elem::U8, ReduceOp::Max, host_);
}

std::vector<std::vector<int64_t>> RankAgreement::gather(const Failure& failed,
                                                        const LocalOutcome& mine,
                                                        const std::vector<int64_t>& row) {
  const int world = comm_.size();
  const size_t width = row.size() + 1;  // the outcome, then the row
  std::vector<int64_t> mine_row(width);
  mine_row[0] = mine.ok() ? 1 : 0;
  std::copy(row.begin(), row.end(), mine_row.begin() + 1);
  std::vector<int64_t> all(width * size_t(world));
  if (world > 1) {
    try {
      comm_.allgather(mine_row.data(), all.data(), width, Elem::I64, host_);
    } catch (const Error&) {
      if (mine.ok()) throw;
    }
  }
  if (!mine.ok()) dsopt::fail(mine.status, mine.error);  // this rank's own problem comes first
  if (world == 1) return {row};
  std::vector<std::vector<int64_t>> rows;
  std::vector<int> failed_ranks;
  for (int r = 0; r < world; ++r) {
    const auto at = all.begin() + std::ptrdiff_t(width * size_t(r));
    if (at[0] == 0) failed_ranks.push_back(r);
    rows.emplace_back(at + 1, at + std::ptrdiff_t(width));
  }
  if (!failed_ranks.empty()) fail_for(failed, failed_ranks);
  return rows;
}

void RankAgreement::require_same(const std::string& call,
                                 const std::vector<std::vector<int64_t>>& rows,
                                 const std::vector<SameValue>& values) {
  for (size_t r = 1; r < rows.size(); ++r)
    for (const SameValue& v : values)
      if (rows[r][v.index] != rows[0][v.index])
        dsopt::fail(DSOPT_EMISMATCH, call + ": ranks disagree on " + v.what + " (rank 0 and rank " +
                                         std::to_string(r) + " " + v.how + ")");
}

bool RankAgreement::same_call(int64_t tag, bool flag_a, bool flag_b, bool* any_a, bool* any_b,
                              int64_t* lowest, int64_t* highest) {
  // max(tag) and max(-tag) = -min(tag) in one 16-byte reduction; once every
  // rank has the same tag, the low bit of the max says whether some rank set
  // flag_a, and that of the min whether some rank set flag_b.
  int64_t tags[2] = {tag << 1 | (flag_a ? 1 : 0), -(tag << 1 | (flag_b ? 0 : 1))};
  if (comm_.size() > 1)
    comm_.allreduce(tags, tags, 2, Elem::I64, ReduceOp::Max, host_);
  const int64_t high = tags[0] >> 1, low = -tags[1] >> 1;
  if (high == low) {
    *any_a = (tags[0] & 1) != 0;
    *any_b = (-tags[1] & 1) == 0;
    return true;
  }
  *lowest = low;
  *highest = high;
  return false;
}

}  // namespace dsopt
