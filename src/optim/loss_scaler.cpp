#include "optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

namespace dsopt {

LossScaler::LossScaler(const LossScaleConfig& cfg)
    : cfg_(cfg),
      dynamic_(cfg.enabled && cfg.static_scale == 0.0),
      scale_(!cfg.enabled ? 1.0
             : cfg.static_scale > 0.0 ? cfg.static_scale
                                      : std::ldexp(1.0, cfg.initial_scale_power)),
      hysteresis_left_(cfg.hysteresis) {}

bool LossScaler::update(bool overflow) {
  if (!dynamic_) return false;
  bool stuck = false;
  if (overflow) {
    if (cfg_.hysteresis == 1 || hysteresis_left_ == 1) {
      stuck = scale_ <= cfg_.min_scale;
      scale_ = std::max(scale_ / 2.0, cfg_.min_scale);
    } else
      --hysteresis_left_;
    last_overflow_iter_ = iter_;
  } else {
    if (cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
    if ((iter_ - last_overflow_iter_) % cfg_.window == 0) {
      if (!cfg_.consecutive_hysteresis) hysteresis_left_ = cfg_.hysteresis;
      scale_ *= 2.0;
    }
  }
  ++iter_;
  return stuck;
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace dsopt
