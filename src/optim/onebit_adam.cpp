#include "optim/onebit_adam.hpp"

#include <algorithm>
#include <cstring>

#include "base/error.hpp"
#include "onebit/divergence_hint.hpp"
#include "math/onebit_adam.hpp"
#include "onebit/rule_flag.hpp"
#include "onebit/stage_record.hpp"

namespace dsopt {
namespace {
const char* kStage = "onebit.stage";
const char* kStabilize = "onebit.stabilize";
const char* kRule = "onebit.rule";    // bias_correction (onebit/rule_flag.hpp)
const char* kUnits = "onebit.units";  // compression in the update's units
// The stage record without frozen_after, which kStabilize holds.
constexpr bool kRecordsFrozenAfter = false;
}  // namespace

OneBitAdam::OneBitAdam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                       const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count),
      moments_(this->params(), this->kernels(), "onebit"),
      masks_(count),
      errors_("onebit", {}, nullptr, ""),
      bias_correction_(cfg.defaults.bias_correction),
      update_units_(cfg.stabilize) {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < count; ++i) {
    (non_freeze(i) ? full_ : compressed_).push_back(i);
    if (!non_freeze(i)) sizes.push_back(this->params().params()[size_t(i)].numel);
  }
  errors_ = CarErrors("onebit", sizes, StageRecord::world_in(kStage, kRecordsFrozenAfter),
                      "its compression errors (1-bit Adam's error feedback)");
}

bool OneBitAdam::non_freeze(int64_t i) const {
  return config().non_freeze[size_t(params().params()[size_t(i)].group)];
}

std::vector<OneBitConsts> OneBitAdam::consts() const {
  std::vector<OneBitConsts> c;
  for (int32_t g = 0; g < num_groups(); ++g) {
    // v is updated on every warmup step, and always in non_freeze groups,
    // whose momentum is never compressed and which keep warmup math.
    const bool frozen = stage_.compressing && !config().non_freeze[size_t(g)];
    const int64_t t = group_step(g);
    c.push_back(onebit_consts(group(g), bias_correction_, t, frozen ? stage_.frozen_after : t));
    if (frozen) c.back().momentum_limit = config().momentum_limit(group(g).beta2, stage_.frozen_after);
    c.back().update_units = frozen && update_units_ && car_ != nullptr;
  }
  return c;
}

std::string OneBitAdam::divergence_hint() const {
  return onebit_divergence_hint(config().stabilize,
                                "compression stage diverges where the frozen variance",
                                "lr", "freeze_step");
}

void OneBitAdam::enter_compression(int64_t warmup_updates) {
  stage_ = FreezeStage{true, warmup_updates};
  if (comm().size() > 1 && !compressed_.empty()) {
    std::vector<int64_t> sizes;
    for (int64_t i : compressed_) sizes.push_back(params().params()[size_t(i)].numel);
    car_ = std::make_unique<CompressedAllreduce>(comm(), kernels(), mem(), sizes);
  }
}

bool OneBitAdam::update(const PreparedGrads& grads) {
  const std::vector<OneBitConsts> c = consts();
  if (!stage_.compressing) {
    const std::vector<UpdateSlot>& slots = moments_.all_slots(params(), grads);
    kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), grads.mul1, grads.mul2);
    // DeepSpeed's counter k = updates + 1 (docs/design/decisions.md G2).
    if (FreezeStage::due(group_step(0), config().freeze_step)) enter_compression(group_step(0));
    return false;
  }
  if (!full_.empty()) {
    const std::vector<UpdateSlot> slots = moments_.slots(params(), &grads, full_);
    kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), grads.mul1, grads.mul2);
  }
  if (!compressed_.empty()) {
    const std::vector<UpdateSlot> slots = moments_.slots(params(), &grads, compressed_, masks_.pointers());
    kernels().update(UpdateRule::OneBitMomentum, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), grads.mul1, grads.mul2);
    if (car_) {
      std::vector<float*> momentum;
      for (const UpdateSlot& s : slots) momentum.push_back(s.floats(Operand::M));
      car_->run(momentum.data());
    }
    kernels().update(UpdateRule::OneBitApply, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), 1.0f, 1.0f);
  }
  return true;
}

void OneBitAdam::set_momentum_mask(int64_t i, const dsopt_tensor* mask) {
  if (mask && i >= 0 && i < params().count() && non_freeze(i))
    fail(DSOPT_EINVAL, "dsopt_set_momentum_mask: parameter " + std::to_string(i) +
                           " is in a non_freeze group, whose momentum is never compressed");
  masks_.set(kernels(), params(), i, mask);
}

void OneBitAdam::describe_state(StateSchema& s) {
  moments_.describe(s, flat_slices());
  StageRecord::describe(s, kStage, kRecordsFrozenAfter,
                        [this] {
                          return StageRecord{stage_, config().freeze_step, CarErrors::world_of(car_.get())};
                        })
      .record(
          kStabilize, 8, [this](FieldWriter& f) { f.add(stage_.frozen_after); },
          [](FieldReader& f) { StageRecord::check_frozen_after(f.get<int64_t>()); }, nullptr)
      .flag(kRule, kBiasCorrectionRule, [this] { return bias_correction_; },
            [this](bool on) { bias_correction_ = on; })
      .flag(kUnits, kUnitsRule, [this] { return update_units_; },
            [this](bool on) { update_units_ = on; })
      .then([this](const BlobReader& r) { resume_stage(r); });
  // Errors belong to the world size that produced them (K1/K2): restored at
  // the same P, zero otherwise. The compressed allreduce runs over the
  // compressed parameters, in order.
  errors_.describe(
      s, kernels(), [this] { return car_.get(); },
      [this](const BlobReader& r) {
        return car_ && rank_local_world(errors_.saved_world(r)) == car_->world();
      },
      [this](int64_t i, float* errors) {
        const auto at = std::find(compressed_.begin(), compressed_.end(), i);
        if (at == compressed_.end()) return StateSchema::Slice{};  // a non_freeze parameter
        return errors_.tensor_slice(errors, size_t(at - compressed_.begin()), comm().size());
      },
      [this] { return comm().size() > 1 && !compressed_.empty(); });
}

void OneBitAdam::resume_stage(const BlobReader& r) {
  StageRecord record = StageRecord::read(r, kStage, kRecordsFrozenAfter);
  FieldReader st(r.section(kStabilize, 8), 8);
  record.stage.frozen_after = st.get<int64_t>();
  const FreezeStage resumed = record.resumed(config().freeze_step, group_step(0));
  car_.reset();
  stage_ = FreezeStage{};
  if (resumed.compressing) enter_compression(resumed.frozen_after);
}

std::string OneBitAdam::rank_local_state(const BlobReader& r) const {
  return errors_.rank_local_state(r);
}

}  // namespace dsopt
