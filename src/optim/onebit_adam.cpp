#include "optim/onebit_adam.hpp"

#include <cstring>

#include "base/error.hpp"
#include "math/onebit_adam.hpp"

namespace dsopt {
namespace {
const char* kStage = "onebit.stage";
const char* kWorkerError = "onebit.worker_error";
const char* kServerError = "onebit.server_error";
const char* kStabilize = "onebit.stabilize";
constexpr uint64_t kStageBytes = 4 + 8 + 4;  // compressing, freeze_step, world of the errors
}  // namespace

OneBitAdam::OneBitAdam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                       const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count),
      moments_(this->params(), this->kernels(), "onebit"),
      masks_(size_t(count)) {
  for (int64_t i = 0; i < count; ++i) (non_freeze(i) ? full_ : compressed_).push_back(i);
}

bool OneBitAdam::non_freeze(int64_t i) const {
  return config().non_freeze[size_t(params().params()[size_t(i)].group)];
}

std::vector<AdamConsts> OneBitAdam::consts() const {
  std::vector<AdamConsts> c;
  for (int32_t g = 0; g < num_groups(); ++g) {
    c.push_back(onebit_consts(group(g)));
    if (compressing_ && config().stabilize)
      c.back().momentum_limit =
          onebit_momentum_limit(config().stabilize_limit, group(g).beta2, frozen_after_);
  }
  return c;
}

std::string OneBitAdam::divergence_hint() const {
  if (!config().stabilize)
    return "\"stabilize\" is off: DeepSpeed's compression stage diverges where the frozen variance "
           "is near zero; set \"stabilize\": true (the default), or a lower lr or later freeze_step";
  return "try a lower lr, \"gradient_clipping\" or a later freeze_step";
}

void OneBitAdam::enter_compression(int64_t warmup_updates) {
  compressing_ = true;
  frozen_after_ = warmup_updates;
  if (comm().size() > 1 && !compressed_.empty()) {
    std::vector<int64_t> sizes;
    for (int64_t i : compressed_) sizes.push_back(params().params()[size_t(i)].numel);
    car_ = std::make_unique<CompressedAllreduce>(comm(), kernels(), mem(), sizes);
  }
}

bool OneBitAdam::update(const PreparedGrads& grads) {
  const std::vector<AdamConsts> c = consts();
  if (!compressing_) {
    const std::vector<AdamSlot> slots = moments_.slots(params(), &grads);
    kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), grads.mul1, grads.mul2);
    // DeepSpeed's counter k = updates + 1 (DECISIONS G2).
    if (group_step(0) + 1 >= config().freeze_step) enter_compression(group_step(0));
    return false;
  }
  if (!full_.empty()) {
    // non_freeze groups keep warmup math: their momentum is never compressed.
    std::vector<AdamConsts> warmup = c;
    for (AdamConsts& k : warmup) k.momentum_limit = 0.0f;
    const std::vector<AdamSlot> slots = moments_.slots(params(), &grads, full_);
    kernels().update(UpdateRule::OneBitWarmup, slots.data(), int64_t(slots.size()), warmup.data(),
                     num_groups(), grads.mul1, grads.mul2);
  }
  if (!compressed_.empty()) {
    std::vector<const float*> masks;
    for (const DeviceBuffer& m : masks_) masks.push_back(m.floats());
    const std::vector<AdamSlot> slots = moments_.slots(params(), &grads, compressed_, masks);
    kernels().update(UpdateRule::OneBitMomentum, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), grads.mul1, grads.mul2);
    if (car_) {
      std::vector<float*> momentum;
      for (const AdamSlot& s : slots) momentum.push_back(s.m);
      car_->run(momentum.data());
    }
    kernels().update(UpdateRule::OneBitApply, slots.data(), int64_t(slots.size()), c.data(),
                     num_groups(), 1.0f, 1.0f);
  }
  return true;
}

void OneBitAdam::set_momentum_mask(int64_t i, const dsopt_tensor* mask) {
  const std::string who = "dsopt_set_momentum_mask: ";
  if (i < 0 || i >= params().count())
    fail(DSOPT_EINVAL, who + "param_index " + std::to_string(i) + " is out of range (the optimizer has " +
                           std::to_string(params().count()) + " parameters)");
  if (!mask) {
    masks_[size_t(i)] = DeviceBuffer();
    return;
  }
  const Param& p = params().params()[size_t(i)];
  if (!mask->data) fail(DSOPT_EINVAL, who + "mask->data is NULL");
  if (mask->numel != p.numel)
    fail(DSOPT_EINVAL, who + "mask has numel " + std::to_string(mask->numel) + ", parameter " +
                           std::to_string(i) + " has " + std::to_string(p.numel));
  if (mask->dtype != DSOPT_FLOAT32) fail(DSOPT_EINVAL, who + "mask must have dtype DSOPT_FLOAT32");
  const bool on_device = is_cuda_device_pointer(mask->data);
  if (kernels().device() == Device::Cuda && !on_device)
    fail(DSOPT_EINVAL, who + "mask must be CUDA device memory (the optimizer's device is cuda)");
  if (kernels().device() == Device::Cpu && on_device)
    fail(DSOPT_EINVAL, who + "mask is CUDA device memory but the optimizer's device is cpu");
  if (non_freeze(i))
    fail(DSOPT_EINVAL, who + "parameter " + std::to_string(i) +
                           " is in a non_freeze group, whose momentum is never compressed");
  DeviceBuffer copy(kernels(), size_t(p.numel) * 4);
  kernels().copy(copy.get(), mask->data, copy.bytes());
  masks_[size_t(i)] = std::move(copy);
}

std::pair<uint64_t, uint64_t> OneBitAdam::error_bytes(int world) const {
  if (world <= 1) return {0, 0};
  uint64_t worker = 0;
  for (int64_t i : compressed_)
    worker += uint64_t(CompressedAllreduce::padded_length(params().params()[size_t(i)].numel, world)) * 4;
  return {worker, worker / uint64_t(world)};
}

void OneBitAdam::save_sections(BlobWriter& w) const {
  moments_.save(w);
  const int32_t error_world = car_ ? car_->world() : 0;
  FieldWriter f;
  f.add(int32_t(compressing_ ? 1 : 0)).add(config().freeze_step).add(error_world);
  w.section(kStage, f.bytes().data(), f.bytes().size());
  FieldWriter st;
  st.add(frozen_after_);
  w.section(kStabilize, st.bytes().data(), st.bytes().size());
  const auto bytes = error_bytes(error_world);
  w.section_from_device(kWorkerError, car_ ? car_->worker_error() : nullptr, bytes.first, kernels());
  w.section_from_device(kServerError, car_ ? car_->server_error() : nullptr, bytes.second, kernels());
}

void OneBitAdam::check_sections(const BlobReader& r) const {
  moments_.check(r);
  FieldReader f(r.section(kStage, kStageBytes), kStageBytes);
  f.get<int32_t>();
  f.get<int64_t>();
  const int32_t error_world = f.get<int32_t>();
  if (error_world < 0 || error_world == 1)
    fail(DSOPT_ECORRUPT, "state blob: invalid world size of the compression errors");
  const auto bytes = error_bytes(error_world);
  r.section(kWorkerError, bytes.first);
  r.section(kServerError, bytes.second);
  FieldReader st(r.section(kStabilize, 8), 8);
  if (st.get<int64_t>() < 0) fail(DSOPT_ECORRUPT, "state blob: negative warmup count of the frozen variance");
}

void OneBitAdam::restore_sections(const BlobReader& r) {
  moments_.restore(r);
  FieldReader f(r.section(kStage, kStageBytes), kStageBytes);
  const bool saved_compressing = f.get<int32_t>() != 0;
  const int64_t saved_freeze_step = f.get<int64_t>();
  const int32_t error_world = f.get<int32_t>();
  // The persisted stage, unless freeze_step changed: then DeepSpeed's rule.
  const bool compressing = saved_freeze_step == config().freeze_step
                               ? saved_compressing
                               : group_step(0) + 1 >= config().freeze_step;
  FieldReader st(r.section(kStabilize, 8), 8);
  const int64_t saved_frozen_after = st.get<int64_t>();
  car_.reset();
  compressing_ = false;
  frozen_after_ = 0;
  if (!compressing) return;
  // Frozen in the saved run: as then; frozen now by the changed freeze_step:
  // after every update so far.
  enter_compression(saved_compressing ? saved_frozen_after : group_step(0));
  if (!car_) return;
  // Errors belong to the world size that produced them (K1/K2): restored at
  // the same P, zero otherwise.
  if (error_world == car_->world()) {
    const auto bytes = error_bytes(error_world);
    kernels().copy_from_host(car_->worker_error(), r.section(kWorkerError, bytes.first), bytes.first);
    kernels().copy_from_host(car_->server_error(), r.section(kServerError, bytes.second), bytes.second);
  }
}

}  // namespace dsopt
