// The stage record of 1-bit Adam and 1-bit LAMB in their blobs: whether
// the run was compressing, the freeze_step it ran with, (1-bit LAMB only)
// the warmup updates v had when it was frozen, and the world size of its
// compression errors (0: none), which makes them rank-local state.
#pragma once
#include <cstdint>
#include <functional>

#include "base/error.hpp"
#include "algorithms/onebit/car_errors.hpp"
#include "algorithms/onebit/freeze_stage.hpp"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

struct StageRecord {
  FreezeStage stage;  // stage.frozen_after 0 where the record does not hold it
  int64_t freeze_step = 0;
  int32_t world = 0;

  // The record's bytes; `frozen_after`: it holds stage.frozen_after
  // (1-bit LAMB; 1-bit Adam keeps it in a section of its own).
  static uint64_t bytes(bool frozen_after) { return frozen_after ? 4 + 8 + 8 + 4 : 4 + 8 + 4; }
  void write(FieldWriter& f, bool frozen_after) const {
    f.add(int32_t(stage.compressing ? 1 : 0)).add(freeze_step);
    if (frozen_after) f.add(stage.frozen_after);
    f.add(world);
  }
  static StageRecord read(FieldReader& f, bool frozen_after) {
    StageRecord s;
    s.stage.compressing = f.get<int32_t>() != 0;
    s.freeze_step = f.get<int64_t>();
    if (frozen_after) s.stage.frozen_after = f.get<int64_t>();
    s.world = f.get<int32_t>();
    return s;
  }
  // The record in `section` of a blob.
  static StageRecord read(const BlobReader& r, const char* section, bool frozen_after) {
    FieldReader f(r.section(section, bytes(frozen_after)), bytes(frozen_after));
    return read(f, frozen_after);
  }
  // Reads the world size of the errors from the record in `section`.
  static CarErrors::WorldReader world_in(const char* section, bool frozen_after) {
    return [section, frozen_after](const BlobReader& r) { return read(r, section, frozen_after).world; };
  }
  // Throws Error(DSOPT_ECORRUPT) for a negative warmup count of the frozen
  // variance.
  static void check_frozen_after(int64_t warmup_updates) {
    if (warmup_updates < 0)
      fail(DSOPT_ECORRUPT, "state blob: negative warmup count of the frozen variance");
  }
  // The record as section `section` of a state list: saved from `current()`,
  // checked, restored by the algorithm (from the whole blob, once checked).
  static StateSchema& describe(StateSchema& s, const char* section, bool frozen_after,
                               std::function<StageRecord()> current) {
    return s.record(
        section, bytes(frozen_after),
        [current, frozen_after](FieldWriter& f) { current().write(f, frozen_after); },
        [frozen_after](FieldReader& f) {
          const StageRecord saved = read(f, frozen_after);
          check_frozen_after(saved.stage.frozen_after);
          CarErrors::check_world(saved.world);
        },
        nullptr);
  }

  // The stage a run continues in after loading this record, with
  // `freeze_step` now, at `updates` applied updates (FreezeStage::resumed).
  FreezeStage resumed(int64_t freeze_step_now, int64_t updates) const {
    return FreezeStage::resumed(stage, freeze_step, freeze_step_now, updates);
  }
};

}  // namespace dsopt
