// What the 1-bit optimizers' configs hold beyond the hyperparameters
// (docs/reference/config.md), read and written in onebit.cpp.
#pragma once
#include <cstdint>

#include "algorithms/lamb/lamb_coeffs.hpp"
#include "math/stabilized_momentum.hpp"
#include "optim/algorithm.hpp"

namespace dsopt {

// 1-bit Adam's, and what 1-bit LAMB and 0/1 Adam add to.
struct OneBitSettings : virtual AlgorithmSettings {
  int64_t freeze_step = 100000;  // warmup updates before compression (not 0/1 Adam's)
  bool stabilize = true;         // the stabilized compression stage
  double stabilize_limit = 4.0;  // its momentum limit (math/stabilized_momentum.hpp)

  // OneBitConsts::momentum_limit of a group with `beta2` whose v has had
  // `variance_updates` updates: 0 (not clamped) when stabilize is off.
  float momentum_limit(double beta2, int64_t variance_updates) const {
    return stabilize ? onebit_momentum_limit(stabilize_limit, beta2, variance_updates) : 0.0f;
  }
};

// 1-bit LAMB: the trust-ratio settings too.
struct OneBitLambSettings : OneBitSettings, LambSettings {};

// 0/1 Adam's schedules (docs/design/zero-one-adam.md section 1;
// docs/optimizers/zero-one-adam.md "0/1 Adam").
struct ZeroOneSettings : OneBitSettings {
  int64_t var_freeze_step = 100000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
  bool decoupled_sync_weight_decay = false;  // docs/design/decisions.md Z1
};

}  // namespace dsopt
