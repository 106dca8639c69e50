#include "algorithms/onebit/zero_one_adam.hpp"

#include <cstring>

#include "base/error.hpp"
#include "math/onebit_adam.hpp"
#include "algorithms/onebit/divergence_hint.hpp"

namespace dsopt {
namespace {
const char* kSchedule = "zoadam.schedule";
const char* kInterval = "zoadam.interval";  // per group: lrs and decay since the last sync
const char* kAccumulator = "zoadam.accumulator";
const char* kAnchor = "zoadam.anchor";
constexpr uint64_t kScheduleBytes = 4 + 5 * 8 + 4;  // Schedule, world of the errors
// No schedule value exceeds the largest step count (configs cap
// var_freeze_step and local_step_clipper at 2^62); blobs beyond it are corrupt.
constexpr int64_t kMaxSchedule = int64_t(1) << 62;

// min(limit, 2 x) without overflow (x >= 1, limit >= 1).
int64_t doubled(int64_t x, int64_t limit) { return x >= limit - x ? limit : 2 * x; }

// What a blob's schedule record holds: the schedule, then the world size
// of the errors (0: none).
ZeroOneAdam::Schedule read_schedule(FieldReader& f, int32_t* world) {
  ZeroOneAdam::Schedule s;
  s.frozen = f.get<int32_t>();
  s.var_interval = f.get<int64_t>();
  s.var_counter = f.get<int64_t>();
  s.local_interval = f.get<int64_t>();
  s.local_counter = f.get<int64_t>();
  s.variance_updates = f.get<int64_t>();
  *world = f.get<int32_t>();
  return s;
}

int32_t error_world(const BlobReader& r) {
  FieldReader f(r.section(kSchedule, kScheduleBytes), kScheduleBytes);
  int32_t world = 0;
  read_schedule(f, &world);
  return world;
}

void check_schedule(FieldReader& f) {
  int32_t world = 0;
  const ZeroOneAdam::Schedule s = read_schedule(f, &world);
  const auto in_range = [](int64_t x, int64_t lo) { return x >= lo && x <= kMaxSchedule; };
  if ((s.frozen != 0 && s.frozen != 1) || !in_range(s.var_interval, 1) ||
      !in_range(s.var_counter, 0) || !in_range(s.local_interval, 1) ||
      !in_range(s.local_counter, 0) || !in_range(s.variance_updates, 0))
    fail(DSOPT_ECORRUPT, "state blob: invalid 0/1 Adam schedule");
  CarErrors::check_world(world);
}
}  // namespace

ZeroOneAdam::ZeroOneAdam(OptimizerParts& parts)
    : OneBitOptimizer(parts, Sections{"zoadam", nullptr, false, "zoadam.rule", "zoadam.units",
                               "its compression errors and accumulator (0/1 Adam's rank-local state)",
                               error_world}),
      moments_(parts_.params(), parts_.kernels(), "zoadam") {
  const size_t bytes = size_t(parts_.params().total_numel()) * 4;
  acc_ = DeviceBuffer(parts_.kernels(), bytes);
  anchor_ = DeviceBuffer(parts_.kernels(), bytes);
  parts_.kernels().fill_zero(acc_.get(), bytes);
  parts_.kernels().fill_zero(anchor_.get(), bytes);
  reset_interval();
  // The compressed allreduce runs over every parameter, in order, for the
  // whole run.
  std::vector<int64_t> all;
  for (int64_t i = 0; i < parts.params().count(); ++i) all.push_back(i);
  compress_params(all);
  compress_from_start();
}

void ZeroOneAdam::reset_interval() {
  lrs_.assign(size_t(parts_.num_groups()), 0.0);
  decay_.assign(size_t(parts_.num_groups()), 1.0);
}

// Full steps fall on k mod var_interval == 0 (k of the coming update, G2);
// only they average gradients at full precision.
bool ZeroOneAdam::averaged(int64_t) const {
  const int64_t k = parts_.group_step(0) + 2;
  return !sched_.frozen && k % sched_.var_interval == 0;
}

std::vector<ZeroOneConsts> ZeroOneAdam::consts(bool clamp) const {
  std::vector<ZeroOneConsts> c;
  for (int32_t g = 0; g < parts_.num_groups(); ++g) {
    c.emplace_back();
    static_cast<OneBitConsts&>(c.back()) =
        onebit_consts(parts_.group(g), bias_correction(), parts_.group_step(g), sched_.variance_updates);
    c.back().decoupled_sync = zero_one().decoupled_sync_weight_decay;
    if (clamp) c.back().momentum_limit = settings().momentum_limit(parts_.group(g).beta2, sched_.variance_updates);
    c.back().update_units = compresses_update_units();
  }
  return c;
}

std::vector<UpdateSlot> ZeroOneAdam::slots(const PreparedGrads* grads) const {
  std::vector<UpdateSlot> s = moments_.slots(parts_.params(), grads, {}, mask_pointers());
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t offset = parts_.params().params()[i].offset;
    s[i].set(Operand::Acc, acc_.floats() + offset);
    s[i].set(Operand::Anchor, anchor_.floats() + offset);
  }
  return s;
}

std::string ZeroOneAdam::divergence_hint() const {
  return onebit_divergence_hint(settings().stabilize, "1-bit steps diverge where the variance",
                                "lr", "var_freeze_step");
}

UpdateOutcome ZeroOneAdam::update(const PreparedGrads& grads) {
  const int64_t k = parts_.group_step(0) + 1;  // DeepSpeed's counter (G2)
  if (sched_.frozen) local_phase_step(grads, k);
  else variance_phase_step(grads, k);
  return UpdateOutcome{phase_ != DSOPT_PHASE_FULL && phase_ != DSOPT_PHASE_LOCAL};
}

void ZeroOneAdam::variance_phase_step(const PreparedGrads& grads, int64_t k) {
  if (k % sched_.var_interval == 0) {
    // Full step: the gradients arrived averaged; v and m as in 1-bit Adam's
    // warmup. Once a 1-bit step has fed m a decompressed gradient, m can be
    // +-scale where v ~ 0, so from then on full steps clamp too (with v's
    // count after this update).
    const bool compressed_before = sched_.variance_updates < parts_.group_step(0) - 1;
    ++sched_.variance_updates;
    const std::vector<ZeroOneConsts> all = consts(compressed_before);
    const std::vector<OneBitConsts> c(all.begin(), all.end());  // what 1-bit Adam's warmup reads
    const std::vector<UpdateSlot> s = slots(&grads);
    parts_.kernels().update(UpdateRule::OneBitWarmup, s.data(), int64_t(s.size()), c.data(), parts_.num_groups(),
                     grads.mul1, grads.mul2);
    if (++sched_.var_counter == zero_one().var_update_scaler) {
      sched_.var_counter = 0;
      sched_.var_interval = doubled(sched_.var_interval, kMaxSchedule);
    }
    phase_ = DSOPT_PHASE_FULL;
  } else {
    // 1-bit step: the gradient itself goes through the compressed allreduce
    // (error feedback on gradients), staged in the accumulator's memory so
    // caller buffers are never written (G1). One rank: the local gradient (Z2).
    const std::vector<ZeroOneConsts> c = consts(true);
    std::vector<UpdateSlot> s = slots(&grads);
    float mul1 = grads.mul1, mul2 = grads.mul2;
    if (has_car()) {
      parts_.kernels().transform(grads.grads.data(), int64_t(grads.grads.size()), mul1, acc_.floats(), nullptr);
      if (mul2 != 1.0f) {
        const TensorRef whole{acc_.floats(), parts_.params().total_numel(), DType::F32};
        parts_.kernels().transform(&whole, 1, mul2, acc_.floats(), nullptr);
      }
      if (update_units())
        parts_.kernels().update(UpdateRule::ZeroOneGradientPrepare, s.data(), int64_t(s.size()), c.data(),
                         parts_.num_groups(), 1.0f, 1.0f);
      run_compressed(s, Operand::Acc);
      for (UpdateSlot& slot : s) {
        slot.set(Operand::Grad, slot.data(Operand::Acc));
        slot.grad_dtype = DType::F32;
      }
      mul1 = mul2 = 1.0f;
    }
    parts_.kernels().update(UpdateRule::ZeroOneGradient, s.data(), int64_t(s.size()), c.data(), parts_.num_groups(),
                     mul1, mul2);
    phase_ = DSOPT_PHASE_COMPRESSED;
  }
  if (k > zero_one().var_freeze_step) freeze();
}

void ZeroOneAdam::freeze() {
  // The errors carried gradient errors; from now on they carry accumulator
  // errors (docs/design/zero-one-adam.md section 3). Phase 2 starts from the current parameters.
  sched_.frozen = 1;
  reset_compression_errors();
  restart_interval();
}

void ZeroOneAdam::restart_interval() {
  parts_.kernels().fill_zero(acc_.get(), acc_.bytes());
  for (const Param& p : parts_.params().params())
    parts_.kernels().copy(anchor_.floats() + p.offset, p.master, size_t(p.numel) * 4);
  reset_interval();
}

void ZeroOneAdam::local_phase_step(const PreparedGrads& grads, int64_t k) {
  for (int32_t g = 0; g < parts_.num_groups(); ++g) {
    // The sync turns the accumulator back into a momentum by dividing by
    // the interval's lr, each weighted by the bias correction its step
    // applied to the momentum.
    lrs_[size_t(g)] += parts_.group(g).lr * onebit_momentum_scale(parts_.group(g), bias_correction(), parts_.group_step(g));
    decay_[size_t(g)] *= 1.0 - parts_.group(g).lr * parts_.group(g).weight_decay;
  }
  const std::vector<ZeroOneConsts> c = consts(true);
  const std::vector<UpdateSlot> s = slots(&grads);
  parts_.kernels().update(UpdateRule::ZeroOneLocal, s.data(), int64_t(s.size()), c.data(), parts_.num_groups(),
                   grads.mul1, grads.mul2);
  const bool is_sync = k % sched_.local_interval == 0;
  if (is_sync) sync(s);
  if (++sched_.local_counter == zero_one().local_step_scaler) {
    sched_.local_counter = 0;
    sched_.local_interval = doubled(sched_.local_interval, zero_one().local_step_clipper);
  }
  phase_ = is_sync ? DSOPT_PHASE_SYNC : DSOPT_PHASE_LOCAL;
}

void ZeroOneAdam::sync(const std::vector<UpdateSlot>& s) {
  // In the update's units the accumulator (a sum of lr-weighted updates)
  // goes as it is, and SyncApply multiplies the average by d.
  std::vector<ZeroOneConsts> c = consts(true);
  if (!c.front().update_units)
    parts_.kernels().update(UpdateRule::ZeroOneSyncPrepare, s.data(), int64_t(s.size()), c.data(),
                     parts_.num_groups(), 1.0f, 1.0f);
  run_compressed(s, Operand::Acc);
  for (int32_t g = 0; g < parts_.num_groups(); ++g) {
    ZeroOneConsts& cg = c[size_t(g)];
    cg.lrs = float(lrs_[size_t(g)]);
    cg.anchor_decay = float(decay_[size_t(g)]);
    // The accumulator sums lrs worth of momenta: its bound is lrs times the
    // local steps' bound.
    if (cg.momentum_limit > 0.0f) cg.momentum_limit = cg.momentum_limit * cg.lrs;
  }
  parts_.kernels().update(UpdateRule::ZeroOneSyncApply, s.data(), int64_t(s.size()), c.data(),
                   parts_.num_groups(), 1.0f, 1.0f);
  reset_interval();
}

void ZeroOneAdam::describe_state(StateSchema& s) {
  const uint64_t interval_bytes = uint64_t(parts_.num_groups()) * 16;
  // The rank-local state (K1/K2) is restored at the world size that saved
  // it; elsewhere it starts over (the list's last step, below).
  const auto at_same_world = [this](const BlobReader& r) { return same_world(r); };
  moments_.describe(s, parts_.flat_slices());
  s.record(
       kSchedule, kScheduleBytes,
       [this](FieldWriter& f) {
         f.add(sched_.frozen).add(sched_.var_interval).add(sched_.var_counter)
             .add(sched_.local_interval).add(sched_.local_counter).add(sched_.variance_updates)
             .add(car_world());
       },
       check_schedule,
       [this](FieldReader& f) {
         int32_t world = 0;
         sched_ = read_schedule(f, &world);
       })
      .record(
          kInterval, interval_bytes,
          [this](FieldWriter& f) {
            for (double x : lrs_) f.add(x);
            for (double x : decay_) f.add(x);
          },
          nullptr, nullptr)
      .array(kAccumulator, parts_.kernels(), [this] { return acc_.get(); },
             [this](const BlobReader*) { return uint64_t(acc_.bytes()); }, at_same_world)
      .array(kAnchor, parts_.kernels(), [this] { return anchor_.get(); },
             [this](const BlobReader*) { return uint64_t(anchor_.bytes()); }, at_same_world)
      .then([this](const BlobReader&) { reset_compression_errors(); });
  // The compressed allreduce runs over every parameter, in order.
  describe_errors(s);
  describe_rules(s).then([this, interval_bytes](const BlobReader& r) {
    if (same_world(r)) {
      const uint8_t* interval = r.section(kInterval, interval_bytes);
      std::memcpy(lrs_.data(), interval, lrs_.size() * 8);
      std::memcpy(decay_.data(), interval + lrs_.size() * 8, decay_.size() * 8);
      return;
    }
    // Another world size (K2): the rank-local accumulator starts over from
    // the saved parameters, as if a sync had just happened there; m, v and
    // the schedules stay.
    restart_interval();
  });
}

}  // namespace dsopt
