// dsopt_step_info.grads_replicated: whether the local gradients of one of
// the first steps are bit-identical on every rank, i.e. something else
// (DistributedDataParallel) has averaged them already and dsopt averages
// them again. Each rank hashes samples of its gradients (the first and last
// bytes of each, as ParamSet::fingerprint samples parameters) and one
// 16-byte allreduce compares the hashes. Only the run's first steps are
// checked (the optimizer decides which: kCheckedSteps); afterwards nothing
// is computed or sent.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/rank_agreement.hpp"
#include "dsopt.h"
#include "kernels/kernels.hpp"
#include "params/param_set.hpp"

namespace dsopt {

class ReplicationCheck {
 public:
  // Steps are checked while the run has applied fewer than this many.
  static constexpr int64_t kCheckedSteps = 3;
  // `kernels` reads the gradients (the optimizer's device).
  explicit ReplicationCheck(Kernels& kernels) : kernels_(kernels) {}

  // Whether the coming step's gradients are compared across ranks: at more
  // than one rank, while the run has applied fewer than kCheckedSteps steps
  // (the same on every rank; a run resumed from a blob counts from the
  // blob's steps).
  static bool applies(int world, int64_t steps_applied) {
    return world > 1 && steps_applied < kCheckedSteps;
  }
  // The step's grads_replicated, for a step that applies(): hashes
  // dsopt_step's `grads` (count -1: the hash of those handed over is
  // ready) and compares it across ranks (collective).
  bool check_step(const ParamSet& params, const dsopt_tensor* grads, int64_t count,
                  RankAgreement& agreement);

  // Starts the coming step's hash.
  void begin();
  // Adds gradient `index` (the step's, or one micro-batch's handed over
  // with dsopt_grad_ready) to it: a sum of per-gradient hashes, so the
  // order of hand-overs does not matter.
  void add(int64_t index, const dsopt_tensor& grad);
  // Collective: compares the hash with every rank's. True when they are
  // all equal and some sampled gradient element is not zero (all-zero
  // gradients are equal without having been averaged).
  bool agree(RankAgreement& agreement);

 private:
  Kernels& kernels_;
  uint64_t sum_ = 0;
  bool nonzero_ = false;
  std::vector<uint8_t> first_, last_;  // samples of one gradient
};

}  // namespace dsopt
