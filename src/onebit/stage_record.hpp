// The stage record of 1-bit Adam and 1-bit LAMB in their blobs: whether
// the run was compressing, the freeze_step it ran with, (1-bit LAMB only)
// the warmup updates v had when it was frozen, and the world size of its
// compression errors (0: none), which makes them rank-local state.
#pragma once
#include <cstdint>
#include <string>

#include "onebit/freeze_stage.hpp"
#include "state/blob.hpp"

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
};

// dsopt_state_load's description of a blob's rank-local state: `what`
// where its errors came from several ranks, else nothing.
inline std::string rank_local_errors(int32_t world, const std::string& what) {
  return world > 1 ? what : std::string();
}

}  // namespace dsopt
