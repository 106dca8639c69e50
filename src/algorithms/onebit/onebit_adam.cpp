#include "algorithms/onebit/onebit_adam.hpp"

#include "base/error.hpp"
#include "math/onebit_adam.hpp"

namespace dsopt {
namespace {
const char* kStabilize = "onebit.stabilize";
}  // namespace

OneBitAdam::OneBitAdam(OptimizerParts& parts)
    : OneBitOptimizer(parts, Sections{"onebit", "onebit.stage",
                               false,  // frozen_after is in kStabilize
                               "onebit.rule", "onebit.units",
                               "its compression errors (1-bit Adam's error feedback)", nullptr}),
      moments_(parts_.params(), parts_.kernels(), "onebit") {
  for (int64_t i = 0; i < parts.params().count(); ++i) (non_freeze(i) ? full_ : compressed_).push_back(i);
  compress_params(compressed_);
}

bool OneBitAdam::non_freeze(int64_t i) const {
  return parts_.config().non_freeze[size_t(parts_.params().params()[size_t(i)].group)];
}

std::vector<OneBitConsts> OneBitAdam::consts() const {
  std::vector<OneBitConsts> c;
  for (int32_t g = 0; g < parts_.num_groups(); ++g) {
    // v is updated on every warmup step, and always in non_freeze groups,
    // whose momentum is never compressed and which keep warmup math.
    const bool frozen = stage().compressing && !parts_.config().non_freeze[size_t(g)];
    const int64_t t = parts_.group_step(g);
    c.push_back(onebit_consts(parts_.group(g), bias_correction(), t, frozen ? stage().frozen_after : t));
    if (frozen) c.back().momentum_limit = frozen_momentum_limit(g);
    c.back().update_units = frozen && compresses_update_units();
  }
  return c;
}

UpdateOutcome OneBitAdam::update(const PreparedGrads& grads) {
  const std::vector<OneBitConsts> c = consts();
  if (!stage().compressing) {
    const std::vector<UpdateSlot>& slots = moments_.all_slots(parts_.params(), grads);
    parts_.kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), c.data(),
                     parts_.num_groups(), grads.mul1, grads.mul2);
    freeze_if_due();
    return UpdateOutcome{};
  }
  if (!full_.empty()) {
    const std::vector<UpdateSlot> slots = moments_.slots(parts_.params(), &grads, full_);
    parts_.kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), c.data(),
                     parts_.num_groups(), grads.mul1, grads.mul2);
  }
  if (!compressed_.empty()) {
    const std::vector<UpdateSlot> slots = moments_.slots(parts_.params(), &grads, compressed_, mask_pointers());
    parts_.kernels().update(UpdateRule::OneBitMomentum, slots.data(), int64_t(slots.size()), c.data(),
                     parts_.num_groups(), grads.mul1, grads.mul2);
    run_compressed(slots, Operand::M);
    parts_.kernels().update(UpdateRule::OneBitApply, slots.data(), int64_t(slots.size()), c.data(),
                     parts_.num_groups(), 1.0f, 1.0f);
  }
  return UpdateOutcome{true};
}

void OneBitAdam::set_momentum_mask(int64_t i, const dsopt_tensor* mask) {
  if (mask && i >= 0 && i < parts_.params().count() && non_freeze(i))
    fail(DSOPT_EINVAL, "dsopt_set_momentum_mask: parameter " + std::to_string(i) +
                           " is in a non_freeze group, whose momentum is never compressed");
  OneBitOptimizer::set_momentum_mask(i, mask);
}

void OneBitAdam::describe_state(StateSchema& s) {
  moments_.describe(s, parts_.flat_slices());
  describe_stage(s).record(
      kStabilize, 8, [this](FieldWriter& f) { f.add(stage().frozen_after); },
      [](FieldReader& f) { StageRecord::check_frozen_after(f.get<int64_t>()); }, nullptr);
  describe_rules(s).then([this](const BlobReader& r) {
    StageRecord record = saved_stage(r);
    FieldReader st(r.section(kStabilize, 8), 8);
    record.stage.frozen_after = st.get<int64_t>();
    resume_stage(record);
  });
  // Errors belong to the world size that produced them (K1/K2): restored at
  // the same P, zero otherwise.
  describe_errors(s);
}

}  // namespace dsopt
