// The fp32 moments of the moment rules and the 1-bit family: the first
// (m) and, for all but Lion, the second (v), one flat buffer each over all
// parameters, and the update slots that point into them.
#pragma once
#include <string>
#include <vector>

#include "kernels/device_buffer.hpp"
#include "params/param_set.hpp"
#include "optim/step_pipeline.hpp"
#include "state/section_names.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class Moments {
 public:
  // Zero moments for every parameter, as `names` lists them (2: m and v;
  // 1: m alone), each saved as the blob section names.section(k).
  // `momentum_tail` extra zero floats follow the momenta in the same buffer
  // (1-bit LAMB's padding, docs/design/decisions.md L4); they are not part
  // of these sections.
  Moments(const ParamSet& params, Kernels& kernels, MomentNames names, int64_t momentum_tail = 0);
  // Zero moments of `numel` elements (a ZeRO shard).
  Moments(int64_t numel, Kernels& kernels, MomentNames names, int64_t momentum_tail = 0);
  int64_t numel() const { return int64_t(bytes_ / 4); }

  float* exp_avg() const { return m_.floats(); }
  float* exp_avg_sq() const { return v_.floats(); }  // nullptr with one moment

  // One slot per parameter in `indices` (all when empty) with its prepared
  // gradient and its mask (masks[i], may be nullptr or shorter).
  std::vector<UpdateSlot> slots(const ParamSet& params, const PreparedGrads* grads,
                                const std::vector<int64_t>& indices = {},
                                const std::vector<const float*>& masks = {}) const;

  // The slots of every parameter, without masks, with this step's
  // gradients: built on first use (and after the parameters are rebound)
  // and then only their gradients refreshed, so a step over many tensors
  // does no per-tensor allocation.
  const std::vector<UpdateSlot>& all_slots(const ParamSet& params, const PreparedGrads& grads);

  // Their sections, shown as the views the names give through `slice`.
  void describe(StateSchema& s, const StateSchema::Slicer& slice);

 private:
  Kernels& kernels_;
  MomentNames names_;
  size_t bytes_;  // of each moment over the parameters
  DeviceBuffer m_, v_;
  std::vector<UpdateSlot> all_slots_;
  uint64_t all_slots_generation_ = 0;  // params.generation() they were built at
};

}  // namespace dsopt
