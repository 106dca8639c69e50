#include "optim/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/error.hpp"
#include "optim/hyper_section.hpp"
#include "state/section_names.hpp"

namespace dsopt {
namespace {

constexpr uint64_t kScalerBytes = 8 + 8 + 8 + 4;

// Values of the common sections no optimizer writes are corrupt: they would
// otherwise reach the step (signed overflow of the counters, a zero or NaN
// loss scale, ...). Checked before anything else in the blob.
void check_common_values(const BlobReader& r) {
  constexpr int64_t kMaxCount = int64_t(1) << 62;
  // Each 8-byte value of a section (none when the blob lacks it).
  const auto each = [&](const char* name, const auto& fn) {
    if (!r.has(name)) return;
    const uint64_t n = r.section_size(name);
    const uint8_t* p = r.section(name, n);
    for (uint64_t at = 0; at + 8 <= n; at += 8) fn(p + at);
  };
  each(kStepsSection, [](const uint8_t* p) {
    int64_t steps;
    std::memcpy(&steps, p, 8);
    if (steps < 0 || steps > kMaxCount)
      fail(DSOPT_ECORRUPT, "state blob: step counter " + std::to_string(steps) + " is out of range");
  });
  each(kLrSection, [](const uint8_t* p) {
    double lr;
    std::memcpy(&lr, p, 8);
    if (!std::isfinite(lr) || lr < 0)
      fail(DSOPT_ECORRUPT, "state blob: learning rate " + std::to_string(lr) + " is not finite and >= 0");
  });
  if (r.has(kScalerSection) && r.section_size(kScalerSection) == kScalerBytes) {
    FieldReader f(r.section(kScalerSection, kScalerBytes), kScalerBytes);
    const double scale = f.get<double>();
    const int64_t iter = f.get<int64_t>(), last_overflow = f.get<int64_t>();
    const int32_t hysteresis_left = f.get<int32_t>();
    if (!std::isfinite(scale) || !(scale > 0) || iter < 0 || iter > kMaxCount ||
        last_overflow < -1 || last_overflow >= iter || hysteresis_left < 1)
      fail(DSOPT_ECORRUPT, "state blob: the loss scaler's state is impossible");
  }
}

std::string describe(const BlobParam& p) {
  return "numel " + std::to_string(p.numel) + ", dtype " +
         (is_valid_dtype(p.dtype) ? dtype_name(DType(p.dtype)) : std::to_string(p.dtype)) +
         ", group " + std::to_string(p.group);
}

void check_shapes(const std::vector<BlobParam>& saved, const std::vector<BlobParam>& live) {
  if (saved.size() != live.size())
    fail(DSOPT_EMISMATCH, "state blob has " + std::to_string(saved.size()) +
                              " parameters, this optimizer has " + std::to_string(live.size()));
  for (size_t i = 0; i < saved.size(); ++i)
    if (!(saved[i] == live[i]))
      fail(DSOPT_EMISMATCH, "state blob parameter " + std::to_string(i) + " has " +
                                describe(saved[i]) + ", this optimizer's has " + describe(live[i]));
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                     const dsopt_tensor* params, int64_t count)
    : cfg_(cfg),
      comm_(comm),
      kernels_(std::move(kernels)),
      host_(make_cpu_kernels(cfg.threads)),
      params_(params, count, int32_t(cfg.groups.size()), *kernels_, cfg.zero.stage == 0),
      agreement_(comm, Mem::host()),
      pipeline_(cfg.pipeline, comm, *kernels_, Mem{kernels_.get(), cfg.cuda_aware}, params_,
                runner_, agreement_, cfg.zero.reduce_bucket_size),
      groups_(cfg.groups),
      steps_(cfg.groups.size(), 0),
      param_steps_(size_t(count), 0),
      replication_(*kernels_),
      divergence_(cfg.pipeline.divergence) {
  for (const Param& p : params_.params()) param_groups_.push_back(p.group);
}

Optimizer::~Optimizer() { stop_reductions(); }

std::vector<uint8_t> Optimizer::averaged_flags() const {
  std::vector<uint8_t> average(size_t(params_.count()));
  for (int64_t i = 0; i < params_.count(); ++i) average[size_t(i)] = averaged(i) ? 1 : 0;
  return average;
}

PreparedGrads Optimizer::prepare(const dsopt_tensor* grads, int64_t count) {
  return pipeline_.prepare(grads, count, averaged_flags());
}

void Optimizer::open_handover(int micro_batches) {
  pipeline_.open_handover(averaged_flags(), micro_batches);
}

void Optimizer::open_window() {
  runner_.set_threaded(comm_.size() > 1 && comm_.concurrent_calls());
  handover_bytes_start_ = comm_.bytes_sent();
  open_handover(cfg_.micro_batches);
  if (checks_replication()) replication_.begin();
  if (comm_.size() > 1) runner_.post([this] { enter_collective(Call::GradReady); });
}

void Optimizer::grad_ready(int64_t param_index, const dsopt_tensor* grad) {
  require_intact("dsopt_grad_ready");
  if (!grad) fail(DSOPT_EINVAL, "dsopt_grad_ready: grad is NULL");
  const std::string error = params_.check_grad(param_index, *grad, "grad");
  if (!error.empty()) fail(DSOPT_EINVAL, "dsopt_grad_ready: " + error);
  GradientHandover& h = handover();
  if (!h.is_open()) open_window();
  try {
    h.hand_over(param_index, TensorRef{grad->data, grad->numel, DType(grad->dtype)});
  } catch (const Error& e) {
    fail(e.status(), std::string("dsopt_grad_ready: ") + e.what());
  }
  if (checks_replication()) replication_.add(param_index, *grad);
}

void Optimizer::rebind_params(const dsopt_tensor* params, int64_t count) {
  refuse_while_handing_over("dsopt_rebind_params");
  try {
    params_.rebind(params, count);
  } catch (const Error& e) {
    fail(e.status(), std::string("dsopt_rebind_params: ") + e.what());
  }
}

bool Optimizer::check_replication(const dsopt_tensor* grads, int64_t count) {
  if (!checks_replication()) return false;
  if (count >= 0) {
    replication_.begin();
    // Absent gradients and those that do not fit (the step rejects them)
    // are left out.
    for (int64_t i = 0; grads && count == params_.count() && i < count; ++i)
      if (params_.check_grad(i, grads[i], "grad").empty()) replication_.add(i, grads[i]);
  }
  return replication_.agree(agreement_);
}

bool Optimizer::enter_collective(Call call, bool absent, bool* someone_abandons) {
  comm_.prepare();
  comm_.set_timeout(cfg_.pipeline.comm_timeout_s);
  const int64_t mine = int64_t(call) << 48 | (calls_ & ((int64_t(1) << 48) - 1));
  ++calls_;
  absent = absent && skips_absent();
  const bool abandons = someone_abandons && *someone_abandons;
  if (comm_.size() == 1) return absent;
  bool someone_absent = false, abandoned = false;
  int64_t lowest = 0, highest = 0;
  if (agreement_.same_call(mine, absent, abandons, &someone_absent, &abandoned, &lowest,
                           &highest)) {
    if (someone_abandons) *someone_abandons = abandoned;
    return someone_absent;
  }
  const auto describe = [](int64_t tag) {
    static const char* const names[] = {"?", "dsopt_step", "dsopt_state_load",
                                        "dsopt_state_load_shards", "dsopt_grad_ready"};
    const int64_t op = tag >> 48;
    return std::string(op >= 1 && op <= 4 ? names[op] : "an unknown call") + " (collective call #" +
           std::to_string((tag & ((int64_t(1) << 48) - 1)) + 1) + " of this optimizer)";
  };
  RankAgreement::fail_different_calls(describe(mine), describe(lowest), describe(highest));
}

StepResult Optimizer::step(const dsopt_tensor* grads, int64_t count) {
  // Handed-over gradients: the step's traffic began with the first one.
  // (While they are, reductions run on dsopt's thread: the communicator's
  // count is read only once the step has waited for them.)
  const uint64_t sent_before = handing_over() ? handover_bytes_start_ : comm_.bytes_sent();
  StepResult r = step_uncounted(grads, count);
  // Deferred gathers count as they run on dsopt's thread: their bytes are
  // known in advance.
  r.bytes_sent = gather_tickets_.empty() ? comm_.bytes_sent() - sent_before
                                         : bytes_at_defer_ - sent_before + deferred_bytes_;
  return r;
}

int64_t Optimizer::gather_bucket_of(int64_t param_index) const {
  param_numel(param_index, nullptr);  // range check
  return gather_chunk_of(param_index);
}

int64_t Optimizer::gathers_pending() {
  int64_t n = 0;
  for (uint64_t t : gather_tickets_)
    if (!runner_.done(t)) ++n;
  return n;
}

bool Optimizer::defer_gathers(int64_t chunks, uint64_t bytes,
                              const std::function<void(int64_t)>& run) {
  if (!cfg_.zero.deferred_allgather || chunks == 0 || comm_.size() == 1 ||
      !comm_.concurrent_calls())
    return false;
  runner_threaded_before_ = runner_.threaded();
  runner_.set_threaded(true);
  bytes_at_defer_ = comm_.bytes_sent();
  deferred_bytes_ = bytes;
  gather_tickets_.clear();
  for (int64_t c = 0; c < chunks; ++c) gather_tickets_.push_back(runner_.post([run, c] { run(c); }));
  comm_.set_pending(this, [this] { wait_gathers_quietly(); });
  return true;
}

void Optimizer::wait_gathers(int64_t bucket, const char* call) {
  if (bucket < 0) comm_.finish_others(this);  // another optimizer's gathers on this communicator
  if (gather_tickets_.empty()) return;
  const int64_t last = int64_t(gather_tickets_.size()) - 1;
  if (bucket < 0 || bucket > last) bucket = last;
  runner_.wait_for(gather_tickets_[size_t(bucket)]);
  if (bucket < last && !runner_.failed()) {
    if (kernels_->device() == Device::Cuda) kernels_->synchronize();
    return;
  }
  gather_tickets_.clear();
  comm_.clear_pending(this);
  try {
    runner_.wait();
    runner_.set_threaded(runner_threaded_before_);  // at-once steps reduce as before
    if (kernels_->device() == Device::Cuda) kernels_->synchronize();
  } catch (const Error& e) {
    mark_failed(e.status(), std::string("the parameter allgather of the step failed: ") + e.what());
    fail(e.status(), std::string(call) + ": the deferred parameter allgather failed: " + e.what() +
                         "; the optimizer is marked failed (docs/robustness.md)");
  } catch (const std::exception& e) {
    mark_failed(DSOPT_EINTERNAL, e.what());
    fail(DSOPT_EINTERNAL, std::string(call) + ": the deferred parameter allgather failed: " + e.what());
  }
}

void Optimizer::wait_gathers_quietly() {
  // Nothing of this optimizer's in flight: leave the communicator alone
  // (at destruction it may already be gone when nothing was deferred).
  if (gather_tickets_.empty()) return;
  try {
    wait_gathers(-1, "dsopt_destroy");
  } catch (...) {
  }
}

StepResult Optimizer::step_uncounted(const dsopt_tensor* grads, int64_t count) {
  require_intact("dsopt_step");
  if (!grads && count == 0) return step_handed_over(false);
  // Abandoned by a rank (NULL, < 0): in the form the others use, as far as
  // this rank can tell (gradients being handed over, or they were last step).
  if (!grads && count < 0 && (handover().is_open() || last_step_handed_over_))
    return step_handed_over(true);
  last_step_handed_over_ = false;
  if (handover().is_open())
    fail(DSOPT_EINVAL, "dsopt_step: gradients of this step were already handed over with "
                       "dsopt_grad_ready; complete it with dsopt_step(opt, NULL, 0, info) "
                       "(nothing was changed)");
  std::vector<uint8_t> present;
  const dsopt_tensor* filled = fill_absent(grads, count, present);
  const bool absent = std::find(present.begin(), present.end(), 0) != present.end();
  agree_absent(enter_collective(Call::Step, absent), std::move(present));
  const bool replicated = check_replication(grads, std::max<int64_t>(count, 0));
  StepResult r = apply(prepare(filled, count));
  r.grads_replicated = replicated;
  return r;
}

const dsopt_tensor* Optimizer::fill_absent(const dsopt_tensor* grads, int64_t count,
                                           std::vector<uint8_t>& present) {
  present.assign(size_t(params_.count()), 1);
  if (!grads || count != params_.count()) return grads;
  int64_t largest = 0;
  for (int64_t i = 0; i < count; ++i)
    if (!grads[i].data) {
      present[size_t(i)] = 0;
      largest = std::max(largest, params_.params()[size_t(i)].numel);
    }
  if (largest == 0) return grads;
  if (zeros_.bytes() < size_t(largest) * 4) {
    zeros_ = DeviceBuffer(*kernels_, size_t(largest) * 4);
    kernels_->fill_zero(zeros_.get(), zeros_.bytes());
  }
  filled_.assign(grads, grads + count);
  for (int64_t i = 0; i < count; ++i)
    if (!present[size_t(i)])
      filled_[size_t(i)] = dsopt_tensor{zeros_.get(), params_.params()[size_t(i)].numel,
                                        DSOPT_FLOAT32, 0};
  return filled_.data();
}

void Optimizer::agree_absent(bool someone, std::vector<uint8_t> present) {
  inactive_.clear();
  if (!someone || !skips_absent()) return;
  agreement_.any_rank(present);
  inactive_.resize(present.size());
  for (size_t i = 0; i < present.size(); ++i) inactive_[i] = present[i] ? 0 : 1;
}

StepResult Optimizer::step_handed_over(bool abandon) {
  // A rank that handed nothing over contributes zeros, like one that missed
  // some parameters: its collectives match the other ranks'.
  last_step_handed_over_ = true;
  GradientHandover& h = handover();
  if (!h.is_open()) open_window();
  PreparedGrads prepared;
  bool replicated = false;
  try {
    h.complete();
    runner_.wait();
    std::vector<uint8_t> present = h.received();
    const bool absent = std::find(present.begin(), present.end(), 0) != present.end();
    bool abandoned = abandon;
    const bool someone_absent = enter_collective(Call::Step, absent, &abandoned);
    if (abandoned)
      pipeline_.fail_step(abandon ? "this rank abandoned the step (dsopt_step with grads NULL and "
                                    "num_grads < 0: a gradient it handed over, or should have, "
                                    "was not usable); nothing was changed"
                                  : "");
    agree_absent(someone_absent, std::move(present));
    replicated = check_replication(nullptr, -1);
    prepared = prepare_handed_over();
  } catch (...) {
    runner_.wait_quietly();
    h.close();
    throw;
  }
  StepResult r = apply(prepared);
  r.grads_replicated = replicated;
  return r;
}

StepResult Optimizer::apply(const PreparedGrads& prepared) {
  bool compressed = false;
  if (!prepared.skip) {
    for (int64_t& s : steps_) ++s;
    for (size_t i = 0; i < param_steps_.size(); ++i)
      if (inactive_.empty() || !inactive_[i]) ++param_steps_[i];
    try {
      compressed = update(prepared);
    } catch (const Error& e) {
      mark_failed(e.status(), e.what());
      throw;
    } catch (const std::exception& e) {
      mark_failed(DSOPT_EINTERNAL, e.what());
      throw;
    }
    divergence_.observe(prepared.grad_norm, prepared.local_norm, comm_.size());
  }
  inactive_.clear();
  const double scale_used = pipeline_.scaler().scale();
  const bool stuck_at_min_scale = pipeline_.finish(prepared);
  consecutive_skips_ = prepared.skip ? consecutive_skips_ + 1 : 0;
  StepResult r;
  r.skipped = prepared.skip;
  r.compressed = compressed;
  r.step = steps_[0];
  r.loss_scale = pipeline_.scaler().scale();
  r.grad_norm = pipeline_.reports_norm() ? prepared.grad_norm : -1.0;
  r.diverging = divergence_.diverging();
  r.consecutive_skips = consecutive_skips_;
  r.phase = prepared.skip ? DSOPT_PHASE_SKIPPED : step_phase(compressed);
  r.alarm = alarm(stuck_at_min_scale, scale_used);
  return r;
}

void Optimizer::mark_failed(int status, const std::string& what) {
  failure_status_ = status;
  failure_ = "step " + std::to_string(steps_[0]) + " failed after it had begun to change the state (" +
             what + ")";
}

void Optimizer::require_intact(const char* call) const {
  if (failure_.empty()) return;
  fail(failure_status_,
       std::string(call) + ": this optimizer's state is inconsistent: " + failure_ +
           "; its parameters and state may differ from any step's, and from the other ranks'. "
           "Destroy it (the only call it still takes besides read-only queries), then on every "
           "rank create a new communicator and optimizer and load the last state saved before "
           "the failure");
}

std::string Optimizer::alarm(bool stuck_at_min_scale, double scale_used) const {
  const int64_t limit = cfg_.pipeline.max_consecutive_skips;
  if (limit == 0 || consecutive_skips_ == 0) return "";
  const std::string hint = "; " + divergence_hint();
  const std::string off = " (\"max_consecutive_skips\": 0 turns this error off)";
  if (stuck_at_min_scale)
    return "gradients overflow at the minimum loss scale " + std::to_string(scale_used) +
           " (fp16.min_loss_scale): the step was skipped and the scale cannot go lower; the "
           "gradients are Inf/NaN at any scale, so the run has diverged" + hint +
           ", or bf16 instead of fp16" + off;
  if (consecutive_skips_ < limit) return "";
  return std::to_string(consecutive_skips_) +
         " steps in a row were skipped because some rank's gradients contained Inf or NaN "
         "(nothing has been updated since); the run has diverged or the loss is broken" +
         hint + off;
}

double Optimizer::lr(int32_t group) const {
  if (group < 0 || group >= num_groups())
    fail(DSOPT_EINVAL, "group " + std::to_string(group) + " is out of range (the optimizer has " +
                           std::to_string(num_groups()) + ")");
  return groups_[size_t(group)].lr;
}

void Optimizer::set_lr(int32_t group, double lr) {
  if (group == -1) {
    for (AdamHyper& g : groups_) g.lr = lr;
    return;
  }
  this->lr(group);  // range check
  groups_[size_t(group)].lr = lr;
}

void Optimizer::set_default_threads(int threads) {
  if (cfg_.threads > 0) return;  // the config's "threads" stays
  host_->set_threads(threads);
  if (kernels_->device() == Device::Cpu) kernels_->set_threads(threads);
}

void Optimizer::set_gradient_clipping(double max_norm) {
  refuse_while_handing_over("dsopt_set_gradient_clipping");
  pipeline_.set_gradient_clipping(max_norm);
}

int64_t Optimizer::param_step(int64_t param_index) const {
  param_numel(param_index, nullptr);  // range check
  return param_steps_[size_t(param_index)];
}

void Optimizer::set_param_step(int64_t param_index, int64_t step) {
  if (!skips_absent())
    fail(DSOPT_EUNSUPPORTED, "dsopt_set_param_step: " + algorithm() +
                                 "'s parameters all follow its steps applied (only the elementwise "
                                 "rules, Adam, AdamW and Lion, count steps per parameter); nothing was changed");
  param_numel(param_index, nullptr);
  if (step < 0)
    fail(DSOPT_EINVAL, "dsopt_set_param_step: step must be >= 0, got " + std::to_string(step));
  param_steps_[size_t(param_index)] = step;
}

AdamStepConsts Optimizer::adam_step_consts() const {
  return dsopt::adam_step_consts(groups_, steps_, param_groups_, param_steps_, inactive_);
}

LambStepConsts Optimizer::lamb_step_consts() const {
  LambStepConsts c;
  for (size_t i = 0; i < param_groups_.size(); ++i) {
    const AdamHyper& h = groups_[size_t(param_groups_[i])];
    c.consts.emplace_back();
    static_cast<OneBitConsts&>(c.consts.back()) =
        onebit_consts(h, h.bias_correction, param_steps_[i], param_steps_[i]);
    c.lr.push_back(h.lr);
  }
  return c;
}

void Optimizer::set_momentum_mask(int64_t, const dsopt_tensor*) {
  fail(DSOPT_EUNSUPPORTED, "dsopt_set_momentum_mask: " + algorithm() +
                               " has no momentum mask (only the 1-bit optimizers do)");
}

Optimizer::MemoryUsage Optimizer::memory_usage() const {
  MemoryUsage m;
  (cfg_.cuda ? m.device : m.host) += kernels_->buffer_bytes();
  m.host += host_->buffer_bytes();
  return m;
}

Optimizer::MemoryUsage Optimizer::state_memory_usage() const {
  const StateSchema::Bytes b = state_schema().array_bytes();
  MemoryUsage m{b.host, b.device};
  // The masters of 16-bit parameters (a common section; ZeRO keeps its
  // shard's in its own list and none here).
  (cfg_.cuda ? m.device : m.host) += uint64_t(params_.master_numel()) * 4;
  return m;
}

uint64_t Optimizer::save(void* dst, uint64_t capacity) const {
  BlobWriter w(dst, capacity);
  w.header(BlobHeader{algorithm(), uint32_t(comm_.size()), uint32_t(comm_.rank()), params_.shapes()});
  w.begin_sections(kCommonSectionCount + state_schema().section_count());
  w.section(kStepsSection, steps_.data(), steps_.size() * 8);
  std::vector<double> lrs;
  for (const AdamHyper& g : groups_) lrs.push_back(g.lr);
  w.section(kLrSection, lrs.data(), lrs.size() * 8);
  const LossScaler::State s = pipeline_.scaler().state();
  FieldWriter f;
  f.add(s.scale).add(s.iter).add(s.last_overflow_iter).add(s.hysteresis_left);
  w.section(kScalerSection, f.bytes().data(), f.bytes().size());
  w.section(kRunSection, &run_id_, 8);
  w.section(kParamStepsSection, param_steps_.data(), param_steps_.size() * 8);
  write_hyper_section(w, cfg_.algorithm->hyper, groups_);
  const std::vector<uint8_t> divergence = divergence_.save();
  w.section(kDivergenceSection, divergence.data(), divergence.size());
  w.section_from_device(kMastersSection, params_.masters(), uint64_t(params_.master_numel()) * 4,
                        *kernels_);
  state_schema().save(w);
  return w.finish();
}

std::unique_ptr<const BlobReader> Optimizer::read_blob(const void* src, uint64_t size) const {
  if (!src) fail(DSOPT_EINVAL, "the blob pointer is NULL");
  auto reader = std::make_unique<const BlobReader>(src, size);
  check_common_values(*reader);
  const BlobHeader& h = reader->header();
  if (h.algorithm != algorithm())
    fail(DSOPT_EMISMATCH, "state blob is from a " + h.algorithm + " optimizer, this one is " + algorithm());
  check_shapes(h.params, params_.shapes());
  if (reader->has(kStepsSection)) {
    const uint64_t saved_groups = reader->section_size(kStepsSection) / 8;
    if (saved_groups != steps_.size())
      fail(DSOPT_EMISMATCH, "state blob has " + std::to_string(saved_groups) +
                                " parameter groups, this optimizer has " + std::to_string(steps_.size()));
  }
  reader->section(kStepsSection, steps_.size() * 8);
  reader->section(kLrSection, groups_.size() * 8);
  reader->section(kScalerSection, kScalerBytes);
  if (reader->has(kRunSection)) reader->section(kRunSection, 8);
  if (reader->has(kParamStepsSection)) {
    const uint8_t* steps = reader->section(kParamStepsSection, param_steps_.size() * 8);
    for (size_t i = 0; i < param_steps_.size(); ++i) {
      int64_t s;
      std::memcpy(&s, steps + 8 * i, 8);
      if (s < 0) fail(DSOPT_ECORRUPT, "state blob has a negative step for parameter " + std::to_string(i));
    }
  }
  read_hyper_section(*reader, cfg_.algorithm->hyper, groups_);  // checked, not applied
  if (reader->has(kDivergenceSection))
    DivergenceCheck::check(reader->section(kDivergenceSection, DivergenceCheck::kStateBytes));
  return reader;
}

Optimizer::Blobs Optimizer::read_blob_set(const void* const* blobs, const uint64_t* sizes,
                                          int64_t count) const {
  if (!blobs) fail(DSOPT_EINVAL, "blobs is NULL");
  if (!sizes) fail(DSOPT_EINVAL, "sizes is NULL");
  if (count < 1) fail(DSOPT_EINVAL, "num_blobs must be >= 1, got " + std::to_string(count));
  Blobs set;
  for (int64_t i = 0; i < count; ++i) {
    try {
      set.push_back(read_blob(blobs[i], sizes[i]));
    } catch (const Error& e) {
      fail(e.status(), "blobs[" + std::to_string(i) + "]: " + e.what());
    }
  }
  if (count == 1) return set;  // one replica, or the only shard of a one-rank run
  const auto run = [](const BlobReader& r) {
    uint64_t id = 0;
    if (r.has(kRunSection)) std::memcpy(&id, r.section(kRunSection, 8), 8);
    return id;
  };
  const auto same = [&](const BlobReader& a, const BlobReader& b, const char* name) {
    if (a.has(name) != b.has(name)) return false;
    if (!a.has(name)) return true;
    const uint64_t n = a.section_size(name);
    return b.section_size(name) == n && std::memcmp(a.section(name, n), b.section(name, n), n) == 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const BlobHeader& h = set[size_t(i)]->header();
    const std::string who = "blobs[" + std::to_string(i) + "]";
    if (h.world_size != uint64_t(count))
      fail(DSOPT_EMISMATCH, who + " was saved by a run of " + std::to_string(h.world_size) +
                                " ranks, but " + std::to_string(count) +
                                " blobs were given (pass all blobs of that run, or one)");
    if (h.rank != uint64_t(i))
      fail(DSOPT_EMISMATCH, who + " is the blob of rank " + std::to_string(h.rank) +
                                " (pass the blobs in rank order, each once)");
    const BlobReader& first = *set[0];
    if (run(*set[size_t(i)]) != run(first))
      fail(DSOPT_EMISMATCH, who + " and blobs[0] were saved by different runs");
    if (!same(*set[size_t(i)], first, kStepsSection) || !same(*set[size_t(i)], first, kScalerSection) ||
        !same(*set[size_t(i)], first, kLrSection) ||
        !same(*set[size_t(i)], first, kParamStepsSection) ||
        !same(*set[size_t(i)], first, kHyperSection))
      fail(DSOPT_EMISMATCH, who + " and blobs[0] were saved at different steps (their step "
                                  "counters, learning rates or loss scalers differ)");
  }
  return set;
}

bool Optimizer::load_collectively(const std::string& call,
                                  const std::function<std::function<void()>(bool& reset)>& validate) {
  std::function<void()> restore_fn;
  bool reset = false;
  const LocalOutcome mine = attempt([&] { restore_fn = validate(reset); });
  // Whether some rank resets (then all do: the ranks' rank-local states
  // must fit together).
  int64_t resets = reset ? 1 : 0;
  agreement_.settle(Failure{call, "could not load its blob", "no rank changed anything"}, mine,
                    &resets, 1);
  reset = resets != 0;
  resetting_rank_local_ = reset;
  try {
    restore_fn();
  } catch (...) {
    resetting_rank_local_ = false;
    throw;
  }
  resetting_rank_local_ = false;
  kernels_->synchronize();
  return reset;
}

bool Optimizer::others_rank_local(const BlobReader& r, bool may_reset) const {
  const BlobHeader& h = r.header();
  const int world = comm_.size(), rank = comm_.rank();
  if (world == 1 || h.world_size != uint32_t(world) || h.rank == uint32_t(rank)) return false;
  const std::string what = rank_local_state(r);
  if (what.empty()) return false;
  if (may_reset) return true;
  fail(DSOPT_EMISMATCH,
       "the blob was saved by rank " + std::to_string(h.rank) + " of " + std::to_string(world) +
           " and holds " + what + ", which belong to that rank; this is rank " +
           std::to_string(rank) + ": load the blob rank " + std::to_string(rank) +
           " saved, or every rank's blob with dsopt_state_load_shards, or reset that state as a "
           "load at another world size does with dsopt_state_load_ex and "
           "DSOPT_LOAD_RESET_RANK_LOCAL (nothing was changed)");
}

void Optimizer::refuse_while_handing_over(const char* call) {
  if (handover().is_open())
    fail(DSOPT_EINVAL, std::string(call) + ": gradients of a step are being handed over with "
                       "dsopt_grad_ready; complete the step with dsopt_step(opt, NULL, 0, info) first "
                       "(nothing was changed)");
}

bool Optimizer::load(const void* src, uint64_t size, uint32_t flags) {
  const char* call = flags == 0 ? "dsopt_state_load" : "dsopt_state_load_ex";
  require_intact(call);
  refuse_while_handing_over(call);
  enter_collective(Call::Load);
  return load_collectively(call, [&](bool& reset) -> std::function<void()> {
    if (flags & ~uint32_t(DSOPT_LOAD_RESET_RANK_LOCAL))
      fail(DSOPT_EINVAL, "unknown flags " + std::to_string(flags) +
                             " (DSOPT_LOAD_RESET_RANK_LOCAL is the only flag)");
    if (!src) fail(DSOPT_EINVAL, "src is NULL");
    std::shared_ptr<const BlobReader> r = read_blob(src, size);
    r->section(kMastersSection, uint64_t(params_.master_numel()) * 4);
    state_schema().check(*r);
    reset = others_rank_local(*r, (flags & DSOPT_LOAD_RESET_RANK_LOCAL) != 0);
    return [this, r] { restore(*r); };
  });
}

void Optimizer::load_shards(const void* const* blobs, const uint64_t* sizes, int64_t count) {
  require_intact("dsopt_state_load_shards");
  refuse_while_handing_over("dsopt_state_load_shards");
  enter_collective(Call::LoadShards);
  load_collectively("dsopt_state_load_shards", [&](bool&) -> std::function<void()> {
    const Blobs set = read_blob_set(blobs, sizes, count);
    if (std::function<void()> fn = reshard(set)) return fn;
    // Replicated state: this rank's own blob at the same size, else the first.
    const bool own = count == comm_.size() && comm_.size() > 1;
    std::shared_ptr<const BlobReader> r = set[own ? size_t(comm_.rank()) : 0];
    r->section(kMastersSection, uint64_t(params_.master_numel()) * 4);
    state_schema().check(*r);
    others_rank_local(*r, false);  // one blob of another rank at this size
    return [this, r] { restore(*r); };
  });
}

void Optimizer::restore_common(const BlobReader& r) {
  std::memcpy(steps_.data(), r.section(kStepsSection, steps_.size() * 8), steps_.size() * 8);
  const uint8_t* lrs = r.section(kLrSection, groups_.size() * 8);
  for (size_t g = 0; g < groups_.size(); ++g) std::memcpy(&groups_[g].lr, lrs + 8 * g, 8);
  FieldReader f(r.section(kScalerSection, kScalerBytes), kScalerBytes);
  LossScaler::State s;
  s.scale = f.get<double>();
  s.iter = f.get<int64_t>();
  s.last_overflow_iter = f.get<int64_t>();
  s.hysteresis_left = f.get<int32_t>();
  pipeline_.scaler().set_state(s);
  if (r.has(kRunSection)) std::memcpy(&run_id_, r.section(kRunSection, 8), 8);
  if (r.has(kParamStepsSection)) {
    std::memcpy(param_steps_.data(), r.section(kParamStepsSection, param_steps_.size() * 8),
                param_steps_.size() * 8);
  } else {  // saved before parameters counted their own steps
    for (size_t i = 0; i < param_steps_.size(); ++i) param_steps_[i] = steps_[size_t(param_groups_[i])];
  }
  groups_ = read_hyper_section(r, cfg_.algorithm->hyper, groups_);
  if (r.has(kDivergenceSection))
    divergence_.restore(r.section(kDivergenceSection, DivergenceCheck::kStateBytes));
  else  // saved before the check existed: it starts over
    divergence_.reset();
}

void Optimizer::restore_masters(const float* host) {
  kernels_->copy_from_host(params_.masters(), host, uint64_t(params_.master_numel()) * 4);
  params_.write_back();
}

void Optimizer::restore(const BlobReader& r) {
  restore_common(r);
  restore_masters(reinterpret_cast<const float*>(
      r.section(kMastersSection, uint64_t(params_.master_numel()) * 4)));
  state_schema().restore(r);
}

const StateSchema& Optimizer::state_schema() const {
  if (!schema_) {
    auto schema = std::make_unique<StateSchema>();
    const_cast<Optimizer*>(this)->describe_state(*schema);  // describing changes nothing
    schema_ = std::move(schema);
  }
  return *schema_;
}

}  // namespace dsopt
