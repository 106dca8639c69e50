// dsopt_step_info.diverging: a run whose global gradient norm grows far
// beyond its own recent history while every value stays finite (no step is
// skipped, so nothing else reports it).
//
// The rule, over the observed steps (applied steps whose norm is > 0 and
// not NaN; +Inf, with "skip_nonfinite": false, is observed as above):
//   x = ln(norm); reference r = a running mean of the finite x: the plain
//   mean over the first `horizon` of them, then an exponential average with
//   weight 1/horizon, each x clamped to [r - ln(factor), r + ln(factor)]
//   before it enters (one outlier moves r by at most ln(factor)/horizon);
//   a step is above when min_steps finite norms were observed before it
//   and x - r > ln(factor) (r before this step's update);
//   an episode starts when `count` of the last `window` observed steps were
//   above, and ends once `window` observed steps in a row were not.
// diverging is 1 on every step of an episode, skipped steps included (they
// leave the state as it is). The norm is the pipeline's global norm (the
// same on every rank), so every rank reports the same.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/config.hpp"

namespace dsopt {

class DivergenceCheck {
 public:
  explicit DivergenceCheck(const DivergenceConfig& cfg) : cfg_(cfg) {}

  // One applied step's global gradient norm (unscaled, before clipping).
  // Returns whether the run is in an episode after it.
  bool observe(double grad_norm);
  bool diverging() const { return diverging_; }

  // The state in the blob's "common.divergence" section.
  static constexpr uint64_t kStateBytes = 8 + 8 + 8 + 4;
  std::vector<uint8_t> save() const;
  // Throws Error(DSOPT_ECORRUPT) when `bytes` (kStateBytes) is not a state
  // save() can write; changes nothing.
  static void check(const uint8_t* bytes);
  void restore(const uint8_t* bytes);
  // The state of a run that has observed nothing (a blob without the section).
  void reset();

 private:
  DivergenceConfig cfg_;
  int64_t observed_ = 0;    // observed steps with a finite norm
  double reference_ = 0.0;  // r, in ln(norm)
  uint64_t recent_ = 0;     // bit i: the i-th last observed step was above
  bool diverging_ = false;
};

}  // namespace dsopt
