// Loss scaling (docs/design/decisions.md G5): the ZeRO DynamicLossScaler rules with
// documented defaults, or a static scale, or none (scale 1).
#pragma once
#include <cstdint>

#include "optim/config.hpp"

namespace dsopt {

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& cfg);
  // The scale the next gradients are (to be) produced with.
  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Called once per step, after the step, with whether it overflowed.
  // Returns true when the step overflowed at min_loss_scale where the scale
  // would have been halved (DeepSpeed's "already at minimum" condition).
  bool update(bool overflow);

  struct State {
    double scale;
    int64_t iter;
    int64_t last_overflow_iter;
    int32_t hysteresis_left;
  };
  State state() const { return {scale_, iter_, last_overflow_iter_, hysteresis_left_}; }
  void set_state(const State& s);

 private:
  LossScaleConfig cfg_;
  bool dynamic_;
  double scale_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int32_t hysteresis_left_;
};

}  // namespace dsopt
