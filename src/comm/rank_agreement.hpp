// How the ranks of a collective dsopt call settle it together when some of
// them may have failed locally (bad arguments, a blob that does not load):
// every rank learns which ranks failed, a rank that failed reports its own
// error, and every other rank reports DSOPT_EMISMATCH naming them. Nothing
// has changed on any rank when a call is settled as failed. This is the
// only place that produces "another rank failed", and the errors of ranks
// that disagree (on what they passed, or on the call they are in).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/comm.hpp"

namespace dsopt {

// What a rank's own part of a collective call came to.
struct LocalOutcome {
  int status = DSOPT_OK;
  std::string error;  // without the call's name
  bool ok() const { return status == DSOPT_OK; }
  static LocalOutcome failure(int status, std::string error) { return {status, std::move(error)}; }
  // Bad arguments when `error` says what is wrong, else success.
  static LocalOutcome invalid_if(std::string error) {
    return error.empty() ? LocalOutcome{} : failure(DSOPT_EINVAL, std::move(error));
  }
};

// Runs f, turning what it throws (Error, bad_alloc) into the outcome.
template <class F>
LocalOutcome attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const Error& e) {
    return {e.status(), e.what()};
  } catch (const std::bad_alloc&) {
    return {DSOPT_ENOMEM, "out of host memory"};
  }
}

// How the other ranks' message describes a failure: "<call>: another rank
// failed: rank <r> <what> (see that rank's error); <consequence>".
struct Failure {
  std::string call;  // "dsopt_step"
  std::string what;  // "could not load its blob"
  std::string consequence = "nothing was changed";
};

// A step that some rank cannot take: its gradients do not fit, or it
// abandoned the step (dsopt_step with grads NULL and num_grads < 0).
extern const Failure kStepFailure;

class RankAgreement {
 public:
  // `host` describes host memory for the communicator.
  RankAgreement(Comm& comm, const Mem& host) : comm_(comm), host_(host) {}

  // What a rank adds to a summed status value (a float or double that
  // travels with other data) when its part failed; a rank whose part found
  // a non-finite gradient adds 1. Sums of fewer than 65536 ranks tell the two
  // apart.
  static constexpr double kFailedWeight = 65536.0;
  static double status_value(bool ok, bool nonfinite) {
    return ok ? (nonfinite ? 1.0 : 0.0) : kFailedWeight;
  }
  static bool some_rank_failed(double summed_status) { return summed_status >= kFailedWeight; }

  // One allreduce (Sum) of this rank's status value and *sum; fail() when
  // some rank failed. Returns whether some rank found a non-finite value;
  // *sum becomes the sum over ranks.
  bool settle_sum(const Failure& failed, const LocalOutcome& mine, bool nonfinite, double* sum);

  // One allreduce (Max) of `flags` (count values, reduced in place) with
  // this rank's outcome; then, when some rank failed, fail() (one allgather
  // more). Returns normally only when every rank succeeded.
  // `failed` says what a failed rank did ("could not load its blob").
  void settle(const Failure& failed, const LocalOutcome& mine, int64_t* flags = nullptr,
              int count = 0);

  // The error path of a call whose ranks already know that some rank
  // failed: one allgather of who failed, then this rank's own error (when
  // it failed) or DSOPT_EMISMATCH naming the ranks that did.
  [[noreturn]] void fail(const Failure& failed, const LocalOutcome& mine);

  // The error the other ranks report, given the ranks that failed (for a
  // call whose data already told every rank who failed).
  [[noreturn]] static void fail_for(const Failure& failed, const std::vector<int>& failed_ranks);

  // Whether every rank passed the same value (one allreduce of 16 bytes).
  bool all_same(uint64_t value);

  // Whether every rank is in the same call: an allreduce (Max) of `tag`
  // (< 2^62, the same on every rank in the same call) and of -tag, with two
  // flags riding in their low bits. Returns false when the tags differ
  // (then *lowest and *highest are the range of the ranks' tags); else
  // *any_a says whether some rank set flag_a, *any_b whether some set flag_b.
  bool same_call(int64_t tag, bool flag_a, bool flag_b, bool* any_a, bool* any_b,
                 int64_t* lowest, int64_t* highest);
  // The error of ranks that same_call found in different calls (DSOPT_EMISMATCH),
  // given this rank's call and the range of the ranks' calls, in words.
  [[noreturn]] static void fail_different_calls(const std::string& mine, const std::string& lowest,
                                                const std::string& highest);

  // Each of the flags (0 or 1) becomes 1 where some rank set it: one
  // allreduce (Max) of the flags' bytes.
  void any_rank(std::vector<uint8_t>& flags);

  // Every rank's `row` (as many values on every rank), by rank, in one
  // allgather that also carries each rank's outcome; then, when some rank
  // failed, its own error as it is (which names the call) on that rank and
  // fail_for on the others.
  std::vector<std::vector<int64_t>> gather(const Failure& failed, const LocalOutcome& mine,
                                           const std::vector<int64_t>& row);

  // A value of gathered rows that every rank must have passed the same,
  // and how a rank that did not is reported.
  struct SameValue {
    size_t index;     // in the row
    std::string what;  // "the config"
    std::string how;   // "passed different settings"
  };
  // Fails with DSOPT_EMISMATCH, "<call>: ranks disagree on <what> (rank 0
  // and rank <r> <how>)", for the first rank r whose row differs from rank
  // 0's in one of `values` (checked in order for each rank).
  static void require_same(const std::string& call, const std::vector<std::vector<int64_t>>& rows,
                           const std::vector<SameValue>& values);

 private:
  Comm& comm_;
  Mem host_;
};

}  // namespace dsopt
