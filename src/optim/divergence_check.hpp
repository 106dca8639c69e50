// dsopt_step_info.diverging: a run whose global gradient norm grows far
// beyond its own recent history while every value stays finite (no step is
// skipped, so nothing else reports it).
//
// The rule, over the observed steps (applied steps whose norm is > 0 and
// not NaN; +Inf, with "skip_nonfinite": false, is observed as above):
//   x = ln(norm), compared with a reference r of the step's kind: averaged
//   (every gradient averaged over the ranks, or one rank) or local (at
//   P > 1 ranks some gradient stays the rank's own: the 1-bit compression
//   stages, 0/1 Adam's local steps; the norm is then sqrt(mean over ranks
//   of ||g_r||^2), up to sqrt(P) times the averaged one). r: the plain mean
//   of the kind's first `horizon` finite x, then an exponential average
//   with weight 1/horizon, each x clamped to r +- ln 2 before it enters, so
//   r follows at most ln 2 / horizon per step (a rise of 2x per horizon)
//   and an outlier barely moves it. A kind's first step after the other's
//   takes the other's r, +- ln(P)/2, and step count.
//   A step is above when its kind has seen min_steps finite norms and
//   x - r > ln(factor) (r before this step's update); an episode starts
//   when `count` of the last `window` observed steps were above, and ends
//   once `window` observed steps in a row were not.
// diverging is 1 on every step of an episode, skipped steps included (they
// leave the state as it is). Norm and kind are the same on every rank, so
// every rank reports the same.
#pragma once
#include <cstdint>
#include <vector>

#include "optim/config.hpp"

namespace dsopt {

class DivergenceCheck {
 public:
  explicit DivergenceCheck(const DivergenceConfig& cfg) : cfg_(cfg) {}

  // One applied step's global gradient norm (unscaled, before clipping);
  // `local`: some gradient of it stayed local at `world` > 1 ranks.
  // Returns whether the run is in an episode after it. Observes nothing
  // while the config turns the check off.
  bool observe(double grad_norm, bool local, int world);
  bool diverging() const { return diverging_; }

  // The state in the blob's "common.divergence" section.
  static constexpr uint64_t kStateBytes = 2 * (8 + 8) + 8 + 4;
  std::vector<uint8_t> save() const;
  // Throws Error(DSOPT_ECORRUPT) when `bytes` (kStateBytes) is not a state
  // save() can write; changes nothing.
  static void check(const uint8_t* bytes);
  void restore(const uint8_t* bytes);
  // The state of a run that has observed nothing (a blob without the section).
  void reset();

 private:
  struct Reference {
    int64_t seen = 0;   // finite norms of this kind observed (or taken over)
    double r = 0.0;     // in ln(norm)
  };
  DivergenceConfig cfg_;
  Reference kinds_[2];      // averaged, local
  uint64_t recent_ = 0;     // bit i: the i-th last observed step was above
  bool diverging_ = false;
};

}  // namespace dsopt
