#include "optim/onebit_lamb.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "onebit/divergence_hint.hpp"
#include "onebit/car_errors.hpp"
#include "math/onebit_lamb.hpp"
#include "onebit/rule_flag.hpp"
#include "onebit/stage_record.hpp"
#include "optim/lamb_step.hpp"

namespace dsopt {
namespace {
const char* kStage = "lamb.stage";
const char* kFresh = "lamb.exp_avg_sq_fresh";
const char* kCoeffs = "lamb.coefficients";
const char* kTail = "lamb.momentum_tail";
const char* kUnits = "lamb.units";  // the stabilized stage's rule (onebit/rule_flag.hpp)
// The stage record holds frozen_after; its world is that of the errors and
// the tail.
constexpr bool kRecordsFrozenAfter = true;

StageRecord read_stage(const BlobReader& r) { return StageRecord::read(r, kStage, kRecordsFrozenAfter); }

int64_t fused_length(int64_t numel, int world) {
  return world > 1 ? CompressedAllreduce::padded_length(numel, world) : numel;
}

DeviceBuffer zeros(Kernels& k, int64_t numel) {
  DeviceBuffer b(k, size_t(numel) * 4);
  k.fill_zero(b.get(), b.bytes());
  return b;
}
}  // namespace

OneBitLamb::OneBitLamb(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                       const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count),
      padded_(fused_length(this->params().total_numel(), comm.size())),
      moments_(this->params(), this->kernels(), "lamb", tail()),
      fresh_(zeros(this->kernels(), this->params().total_numel())),
      u_(this->kernels(), size_t(this->params().total_numel()) * 4),
      aux_(this->kernels(), size_t(this->params().total_numel()) * 4),
      ratio_(this->kernels(), size_t(this->params().total_numel()) * 4),
      coeff_freeze_(size_t(count), 0.0),
      last_factor_(size_t(count), 1.0),
      scaling_(size_t(count), 1.0),
      masks_(count),
      errors_("lamb", {this->params().total_numel()}, StageRecord::world_in(kStage, kRecordsFrozenAfter),
              "its compression errors (1-bit LAMB's error feedback and momentum tail)"),
      update_units_(cfg.stabilize) {}

std::string OneBitLamb::divergence_hint() const {
  return onebit_divergence_hint(config().stabilize,
                                "compression stage diverges where the frozen variance",
                                "lr or max_coeff", "freeze_step");
}

std::vector<UpdateSlot> OneBitLamb::slots(const PreparedGrads* grads) const {
  std::vector<UpdateSlot> s = moments_.slots(params(), grads, {}, masks_.pointers());
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t offset = params().params()[i].offset;
    s[i].group = int32_t(i);
    s[i].set(Operand::VF, fresh_.floats() + offset);
    s[i].set(Operand::U, u_.floats() + offset);
    s[i].set(Operand::Aux, aux_.floats() + offset);
    s[i].set(Operand::Ratio, ratio_.floats() + offset);
  }
  return s;
}

LambStepConsts OneBitLamb::consts() const {
  LambStepConsts c = lamb_step_consts();  // no bias correction (docs/optimizers/onebit-lamb.md "1-bit LAMB")
  if (!stage_.compressing) return c;
  for (size_t i = 0; i < c.consts.size(); ++i) {
    LambConsts& k = c.consts[i];
    k.tensor_scale = float(scaling_[i]);
    k.momentum_limit = config().momentum_limit(group(params().params()[i].group).beta2, stage_.frozen_after);
    k.update_units = update_units_ && car_ != nullptr;
  }
  return c;
}

bool OneBitLamb::update(const PreparedGrads& grads) {
  if (!stage_.compressing) {
    warmup(grads);
    // DeepSpeed's counter k = updates + 1 (docs/design/decisions.md G2).
    if (FreezeStage::due(group_step(0), config().freeze_step)) enter_compression(group_step(0));
    return false;
  }
  compressed(grads);
  return true;
}

void OneBitLamb::warmup(const PreparedGrads& grads) {
  LambStepConsts c = consts();
  const std::vector<double> coeff = lamb_step(kernels(), slots(&grads), c.consts, c.lr, grads.mul1,
                                              grads.mul2, config().lamb, whole_tensors(kernels()));
  for (size_t i = 0; i < coeff.size(); ++i)
    coeff_freeze_[i] = lamb_coeff_ema(coeff_freeze_[i], coeff[i], config().lamb);
}

void OneBitLamb::compressed(const PreparedGrads& grads) {
  const std::vector<UpdateSlot> s = slots(&grads);
  LambStepConsts step = consts();
  std::vector<LambConsts>& c = step.consts;
  const int64_t n = int64_t(s.size());
  kernels().update(UpdateRule::LambMomentum, s.data(), n, c.data(), int32_t(n), grads.mul1, grads.mul2);
  if (car_) {
    float* fused = moments_.exp_avg();
    car_->run(&fused);
  }
  kernels().update(UpdateRule::LambCompressed, s.data(), n, c.data(), int32_t(n), 1.0f, 1.0f);
  // aux holds u0 now; the stabilized rule also needs ||p||.
  const std::vector<double> sums =
      update_units_ ? whole_tensor_sums(kernels(), s, {Operand::U, Operand::Aux, Operand::Param})
                    : whole_tensor_sums(kernels(), s, {Operand::U, Operand::Aux});
  std::vector<TensorRef> ratios;
  for (const UpdateSlot& slot : s) ratios.push_back(TensorRef{slot.data(Operand::Ratio), slot.numel, DType::F32});
  std::vector<float> max_ratio(static_cast<size_t>(n));
  kernels().max_per_tensor(ratios.data(), n, max_ratio.data());
  std::vector<double> coeff(static_cast<size_t>(n));
  for (size_t i = 0; i < size_t(n); ++i) {
    const bool decay = c[i].wd > 0.0f;
    last_factor_[i] = lamb_factor(max_ratio[i], sums[size_t(n) + i], sums[i], decay, last_factor_[i],
                                  config().lamb);
    coeff[i] = coeff_freeze_[i] * last_factor_[i];
    // The stabilized rule: LAMB's own trust ratio of this update (the same
    // on every rank) where it is larger than the frozen estimate.
    if (update_units_)
      coeff[i] = std::max(coeff[i], lamb_warmup_coeff(sums[2 * size_t(n) + i], sums[i], config().lamb));
  }
  lamb_move(kernels(), s, c, step.lr, coeff);
}

void OneBitLamb::enter_compression(int64_t warmup_updates) {
  stage_ = FreezeStage{true, warmup_updates};
  // vf starts as v at the actual transition (L1).
  kernels().copy(fresh_.get(), moments_.exp_avg_sq(), fresh_.bytes());
  const std::vector<UpdateSlot> s = slots(nullptr);
  const std::vector<double> sums = whole_tensor_sums(kernels(), s, {Operand::M});
  std::vector<int64_t> numel;
  for (const UpdateSlot& slot : s) numel.push_back(slot.numel);
  lamb_scaling_coeffs(sums.data(), numel.data(), int64_t(sums.size()), scaling_.data());
  start_compressed_allreduce();
}

void OneBitLamb::start_compressed_allreduce() {
  // One tensor: the whole fused buffer, tail included, so the tail is
  // compressed as it is (L3, L4).
  if (comm().size() > 1)
    car_ = std::make_unique<CompressedAllreduce>(comm(), kernels(), mem(), std::vector<int64_t>{padded_});
}

// ---- state blob -----------------------------------------------------------------
// Coefficients: per tensor lamb_coeff_freeze, last_factor, scaling_coeff
// (doubles).

void OneBitLamb::describe_state(StateSchema& s) {
  const uint64_t coeff_bytes = uint64_t(params().count()) * 24;
  const int64_t total = params().total_numel();
  moments_.describe(s, flat_slices());
  StageRecord::describe(s, kStage, kRecordsFrozenAfter,
                        [this] {
                          return StageRecord{stage_, config().freeze_step, CarErrors::world_of(car_.get())};
                        })
      .array(kFresh, kernels(), [this] { return fresh_.get(); }, uint64_t(fresh_.bytes()))
      .view("exp_avg_sq_fresh", flat_slices())
      .record(
          kCoeffs, coeff_bytes,
          [this](FieldWriter& f) {
            for (size_t i = 0; i < coeff_freeze_.size(); ++i)
              f.add(coeff_freeze_[i]).add(last_factor_[i]).add(scaling_[i]);
          },
          nullptr,
          [this](FieldReader& f) {
            for (size_t i = 0; i < coeff_freeze_.size(); ++i) {
              coeff_freeze_[i] = f.get<double>();
              last_factor_[i] = f.get<double>();
              scaling_[i] = f.get<double>();
            }
          })
      .then([this](const BlobReader& r) { resume_stage(r); });
  // The tail and the errors belong to the world size that produced them
  // (K1/K2): restored at the same P into a stage that was compressing, zero
  // otherwise.
  const auto same_world = [this](const BlobReader& r) {
    const StageRecord saved = read_stage(r);
    return car_ && saved.stage.compressing && rank_local_world(saved.world) == car_->world();
  };
  s.array(kTail, kernels(), [this, total] { return moments_.exp_avg() + total; },
          [this, total](const BlobReader* r) {
            const int32_t world = r ? errors_.saved_world(*r) : CarErrors::world_of(car_.get());
            return world > 1 ? uint64_t(fused_length(total, world) - total) * 4 : 0;
          },
          same_world);
  // One compressed tensor: the fused momentum, parameters at their offsets.
  const StateSchema::Slicer flat = flat_slices();
  errors_.describe(
      s, kernels(), [this] { return car_.get(); }, same_world,
      [flat](int64_t i, float* errors) { return errors ? flat(i, errors) : StateSchema::Slice{}; },
      [this] { return comm().size() > 1; });
  s.flag(kUnits, kUnitsRule, [this] { return update_units_; },
         [this](bool on) { update_units_ = on; });
}

void OneBitLamb::resume_stage(const BlobReader& r) {
  const StageRecord record = read_stage(r);
  const FreezeStage& saved = record.stage;
  kernels().fill_zero(moments_.exp_avg() + params().total_numel(), size_t(tail()) * 4);
  car_.reset();
  const FreezeStage resumed = record.resumed(config().freeze_step, group_step(0));
  stage_ = FreezeStage{};
  if (!resumed.compressing) return;
  if (!saved.compressing) {
    enter_compression(resumed.frozen_after);  // frozen now by a changed freeze_step
    return;
  }
  stage_ = resumed;
  start_compressed_allreduce();
}

std::string OneBitLamb::rank_local_state(const BlobReader& r) const {
  return errors_.rank_local_state(r);
}

}  // namespace dsopt
