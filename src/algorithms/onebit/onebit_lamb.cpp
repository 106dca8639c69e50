#include "algorithms/onebit/onebit_lamb.hpp"

#include <algorithm>
#include <limits>

#include "math/onebit_lamb.hpp"
#include "algorithms/lamb/lamb_coeffs.hpp"
#include "algorithms/lamb/lamb_step.hpp"
#include "algorithms/moment_rules/moment_rule.hpp"

namespace dsopt {
namespace {
const char* kFresh = "lamb.exp_avg_sq_fresh";
const char* kCoeffs = "lamb.coefficients";
const char* kTail = "lamb.momentum_tail";

int64_t fused_length(int64_t numel, int world) {
  return world > 1 ? CompressedAllreduce::padded_length(numel, world) : numel;
}

DeviceBuffer zeros(Kernels& k, int64_t numel) {
  DeviceBuffer b(k, size_t(numel) * 4);
  k.fill_zero(b.get(), b.bytes());
  return b;
}
}  // namespace

OneBitLamb::OneBitLamb(OptimizerParts& parts)
    : OneBitOptimizer(parts, Sections{"lamb", "lamb.stage",
                               true,  // frozen_after; its world is that of the errors and the tail
                               nullptr, "lamb.units",
                               "its compression errors (1-bit LAMB's error feedback and momentum tail)",
                               nullptr}),
      padded_(fused_length(parts.params().total_numel(), parts.comm().size())),
      moments_(parts_.params(), parts_.kernels(), "lamb", tail()),
      fresh_(zeros(parts_.kernels(), parts_.params().total_numel())),
      u_(parts_.kernels(), size_t(parts_.params().total_numel()) * 4),
      aux_(parts_.kernels(), size_t(parts_.params().total_numel()) * 4),
      ratio_(parts_.kernels(), size_t(parts_.params().total_numel()) * 4),
      coeff_freeze_(size_t(parts.params().count()), 0.0),
      last_factor_(size_t(parts.params().count()), 1.0),
      scaling_(size_t(parts.params().count()), 1.0) {
  // One tensor: the whole fused buffer, tail included, so the tail is
  // compressed as it is (L3, L4).
  compress_fused(padded_);
}

std::vector<UpdateSlot> OneBitLamb::slots(const PreparedGrads* grads) const {
  std::vector<UpdateSlot> s = moments_.slots(parts_.params(), grads, {}, mask_pointers());
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t offset = parts_.params().params()[i].offset;
    s[i].group = int32_t(i);
    s[i].set(Operand::VF, fresh_.floats() + offset);
    s[i].set(Operand::U, u_.floats() + offset);
    s[i].set(Operand::Aux, aux_.floats() + offset);
    s[i].set(Operand::Ratio, ratio_.floats() + offset);
  }
  return s;
}

LambStepConsts OneBitLamb::consts() const {
  LambStepConsts c = lamb_step_consts(parts_);  // no bias correction (docs/optimizers/onebit-lamb.md "1-bit LAMB")
  if (!stage().compressing) return c;
  for (size_t i = 0; i < c.consts.size(); ++i) {
    LambConsts& k = c.consts[i];
    k.tensor_scale = float(scaling_[i]);
    k.momentum_limit = frozen_momentum_limit(parts_.params().params()[i].group);
    k.update_units = compresses_update_units();
  }
  return c;
}

UpdateOutcome OneBitLamb::update(const PreparedGrads& grads) {
  if (!stage().compressing) {
    warmup(grads);
    freeze_if_due();
    return UpdateOutcome{};
  }
  compressed(grads);
  return UpdateOutcome{true};
}

void OneBitLamb::warmup(const PreparedGrads& grads) {
  LambStepConsts c = consts();
  const std::vector<double> coeff = lamb_step(parts_.kernels(), slots(&grads), c.consts, c.lr, grads.mul1,
                                              grads.mul2, lamb_coeffs(parts_.config()),
                                              shard_summed(whole_tensors(parts_.kernels()), parts_.shards()));
  for (size_t i = 0; i < coeff.size(); ++i)
    coeff_freeze_[i] = lamb_coeff_ema(coeff_freeze_[i], coeff[i], lamb_coeffs(parts_.config()));
}

void OneBitLamb::compressed(const PreparedGrads& grads) {
  const std::vector<UpdateSlot> s = slots(&grads);
  LambStepConsts step = consts();
  std::vector<LambConsts>& c = step.consts;
  const int64_t n = int64_t(s.size());
  parts_.kernels().update(UpdateRule::LambMomentum, s.data(), n, c.data(), int32_t(n), grads.mul1, grads.mul2);
  run_compressed({moments_.exp_avg()});
  parts_.kernels().update(UpdateRule::LambCompressed, s.data(), n, c.data(), int32_t(n), 1.0f, 1.0f);
  // aux holds u0 now; the stabilized rule also needs ||p||.
  std::vector<double> sums =
      update_units() ? whole_tensor_sums(parts_.kernels(), s, {Operand::U, Operand::Aux, Operand::Param})
                    : whole_tensor_sums(parts_.kernels(), s, {Operand::U, Operand::Aux});
  parts_.shards().sum(sums);  // of whole tensors, where the parameters are shards
  const std::vector<float> max_ratio = max_ratios(s);
  std::vector<double> coeff(static_cast<size_t>(n));
  for (size_t i = 0; i < size_t(n); ++i) {
    const bool decay = c[i].wd > 0.0f;
    last_factor_[i] = lamb_factor(max_ratio[i], sums[size_t(n) + i], sums[i], decay, last_factor_[i],
                                  lamb_coeffs(parts_.config()));
    coeff[i] = coeff_freeze_[i] * last_factor_[i];
    // The stabilized rule: LAMB's own trust ratio of this update (the same
    // on every rank) where it is larger than the frozen estimate.
    if (update_units())
      coeff[i] = std::max(coeff[i], lamb_warmup_coeff(sums[2 * size_t(n) + i], sums[i], lamb_coeffs(parts_.config())));
  }
  lamb_move(parts_.kernels(), s, c, step.lr, coeff);
}

std::vector<float> OneBitLamb::max_ratios(const std::vector<UpdateSlot>& s) const {
  // Empty shards (dsopt_comm_set_shards) have no ratio: -inf, below every
  // other rank's.
  std::vector<float> max_ratio(s.size(), -std::numeric_limits<float>::infinity());
  std::vector<TensorRef> ratios;
  std::vector<size_t> held;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].numel == 0) continue;
    ratios.push_back(TensorRef{s[i].data(Operand::Ratio), s[i].numel, DType::F32});
    held.push_back(i);
  }
  std::vector<float> found(held.size());
  if (!held.empty()) parts_.kernels().max_per_tensor(ratios.data(), int64_t(held.size()), found.data());
  for (size_t k = 0; k < held.size(); ++k) max_ratio[held[k]] = found[k];
  parts_.shards().max(max_ratio);
  return max_ratio;
}

void OneBitLamb::freeze_state() {
  // vf starts as v at the actual transition (L1).
  parts_.kernels().copy(fresh_.get(), moments_.exp_avg_sq(), fresh_.bytes());
  const std::vector<UpdateSlot> s = slots(nullptr);
  std::vector<double> sums = whole_tensor_sums(parts_.kernels(), s, {Operand::M});
  std::vector<double> whole(s.size());  // the tensors' numel, of whole tensors where sharded
  for (size_t i = 0; i < s.size(); ++i) whole[i] = double(s[i].numel);
  parts_.shards().sum(sums);
  parts_.shards().sum(whole);
  std::vector<int64_t> numel;
  for (double w : whole) numel.push_back(int64_t(w));
  lamb_scaling_coeffs(sums.data(), numel.data(), int64_t(sums.size()), scaling_.data());
}

// ---- state blob -----------------------------------------------------------------
// Coefficients: per tensor lamb_coeff_freeze, last_factor, scaling_coeff
// (doubles).

void OneBitLamb::describe_state(StateSchema& s) {
  const uint64_t coeff_bytes = uint64_t(parts_.params().count()) * 24;
  const int64_t total = parts_.params().total_numel();
  moments_.describe(s, parts_.flat_slices());
  describe_stage(s)
      .array(kFresh, parts_.kernels(), [this] { return fresh_.get(); }, uint64_t(fresh_.bytes()))
      .view("exp_avg_sq_fresh", parts_.flat_slices())
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
      .then([this](const BlobReader& r) {
        parts_.kernels().fill_zero(moments_.exp_avg() + parts_.params().total_numel(), size_t(tail()) * 4);
        resume_stage(saved_stage(r));
      });
  // The tail and the errors belong to the world size that produced them
  // (K1/K2): restored at the same P into a stage that was compressing, zero
  // otherwise.
  const auto restore_if = [this](const BlobReader& r) {
    return has_car() && saved_stage(r).stage.compressing && same_world(r);
  };
  s.array(kTail, parts_.kernels(), [this, total] { return moments_.exp_avg() + total; },
          [this, total](const BlobReader* r) {
            const int32_t world = r ? saved_stage(*r).world : car_world();
            return world > 1 ? uint64_t(fused_length(total, world) - total) * 4 : 0;
          },
          restore_if);
  // One compressed tensor: the fused momentum, parameters at their offsets.
  describe_errors(s, restore_if);
  describe_rules(s);
}

}  // namespace dsopt
