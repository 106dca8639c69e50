// The warmup/compression stage machine of the 1-bit optimizers that freeze
// the variance (docs/design/onebit-adam.md section 4, decisions.md G2): DeepSpeed's
// counter k = applied updates + 1 decides, and a blob restores the saved
// stage unless freeze_step changed.
#pragma once
#include <cstdint>

namespace dsopt {

struct FreezeStage {
  bool compressing = false;
  // Warmup updates v had when it was frozen (the stabilized rule's limit
  // depends on it); 0 in warmup.
  int64_t frozen_after = 0;

  // Whether the update that just ran (the `updates`-th) ends the warmup.
  static bool due(int64_t updates, int64_t freeze_step) { return updates + 1 >= freeze_step; }

  // The stage a run continues in after loading a blob saved in `saved` with
  // `saved_freeze_step`, now at `updates` applied updates: the saved stage,
  // unless freeze_step changed, then DeepSpeed's rule (frozen now: after
  // every update so far).
  static FreezeStage resumed(const FreezeStage& saved, int64_t saved_freeze_step,
                             int64_t freeze_step, int64_t updates) {
    if (saved_freeze_step == freeze_step) return saved;
    if (!due(updates, freeze_step)) return FreezeStage{};
    return FreezeStage{true, saved.compressing ? saved.frozen_after : updates};
  }
};

}  // namespace dsopt
