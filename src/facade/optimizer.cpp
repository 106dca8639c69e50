#include "facade/optimizer.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.hpp"
#include "facade/optimizer_impl.hpp"
#include "optim/factory.hpp"

namespace dsopt {

Optimizer::Impl::Impl(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                      const dsopt_tensor* params, int64_t count)
    : parts(cfg, comm, std::move(kernels), params, count,
            [this] { return algorithm->blob_name(); },
            [this](StateSchema& s) { algorithm->describe_state(s); },
            [this](int status, const std::string& what) { mark_failed(status, what); }),
      algorithm(make_algorithm(parts)),
      handshake(comm, parts.agreement(), cfg.pipeline.comm_timeout_s),
      replication(parts.kernels()) {}

Optimizer::Optimizer(const OptimizerConfig& cfg, Comm& comm, const dsopt_tensor* params,
                     int64_t count)
    : Optimizer(cfg, comm, make_kernels(cfg, comm), params, count) {}

Optimizer::Optimizer(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                     const dsopt_tensor* params, int64_t count)
    : impl_(std::make_unique<Impl>(cfg, comm, std::move(kernels), params, count)) {}

Optimizer::~Optimizer() {
  // Nothing of the algorithm's may be in flight when it goes.
  if (impl_) impl_->parts.stop_reductions();
}

void Optimizer::Impl::open_window() {
  parts.runner().set_threaded(parts.comm().size() > 1 && parts.comm().concurrent_calls());
  handover_bytes_start = parts.comm().bytes();
  algorithm->open_handover(parts.config().micro_batches);
  if (checks_replication()) replication.begin();
  if (parts.comm().size() > 1) parts.runner().post([this] { enter_collective(Call::GradReady); });
}

void Optimizer::grad_ready(int64_t param_index, const dsopt_tensor* grad) {
  Impl& s = *impl_;
  s.require_intact("dsopt_grad_ready");
  if (!grad) fail(DSOPT_EINVAL, "dsopt_grad_ready: grad is NULL");
  const std::string error = s.parts.params().check_grad(param_index, *grad, "grad");
  if (!error.empty()) fail(DSOPT_EINVAL, "dsopt_grad_ready: " + error);
  GradientHandover& h = s.algorithm->handover();
  if (!h.is_open()) s.open_window();
  try {
    h.hand_over(param_index, TensorRef{grad->data, grad->numel, DType(grad->dtype)});
  } catch (const Error& e) {
    fail(e.status(), std::string("dsopt_grad_ready: ") + e.what());
  }
  if (s.checks_replication()) s.replication.add(param_index, *grad);
}

void Optimizer::rebind_params(const dsopt_tensor* params, int64_t count) {
  impl_->refuse_while_handing_over("dsopt_rebind_params");
  try {
    impl_->parts.params().rebind(params, count);
  } catch (const Error& e) {
    fail(e.status(), std::string("dsopt_rebind_params: ") + e.what());
  }
}

StepResult Optimizer::step(const dsopt_tensor* grads, int64_t count) {
  Impl& s = *impl_;
  // Handed-over gradients: the step's traffic began with the first one.
  // (While they are, reductions run on dsopt's thread: the communicator's
  // count is read only once the step has waited for them.)
  const CommBytes sent_before =
      s.algorithm->handover().is_open() ? s.handover_bytes_start : s.parts.comm().bytes();
  StepResult r = s.step_uncounted(grads, count);
  // Deferred gathers count as they run on dsopt's thread: their bytes are
  // known in advance.
  const CommBytes sent = s.parts.gathers().bytes_since(sent_before);
  r.bytes_sent = sent.sent;
  r.bytes_inter_node = sent.inter_node;
  return r;
}

StepResult Optimizer::Impl::step_uncounted(const dsopt_tensor* grads, int64_t count) {
  require_intact("dsopt_step");
  if (!grads && count == 0) return step_handed_over(false);
  // Abandoned by a rank (NULL, < 0): in the form the others use, as far as
  // this rank can tell (gradients being handed over, or they were last step).
  if (!grads && count < 0 && (algorithm->handover().is_open() || last_step_handed_over))
    return step_handed_over(true);
  last_step_handed_over = false;
  if (algorithm->handover().is_open())
    fail(DSOPT_EINVAL, "dsopt_step: gradients of this step were already handed over with "
                       "dsopt_grad_ready; complete it with dsopt_step(opt, NULL, 0, info) "
                       "(nothing was changed)");
  std::vector<uint8_t> present;
  const dsopt_tensor* filled = parts.absent().fill(grads, count, present);
  const bool absent = std::find(present.begin(), present.end(), 0) != present.end();
  parts.absent().agree(enter_collective(Call::Step, absent), algorithm->skips_absent(),
                       std::move(present), parts.agreement());
  const bool replicated = check_replication(grads, std::max<int64_t>(count, 0));
  StepResult r = apply(algorithm->prepare(filled, count));
  r.grads_replicated = replicated;
  return r;
}

StepResult Optimizer::Impl::step_handed_over(bool abandon) {
  // A rank that handed nothing over contributes zeros, like one that missed
  // some parameters: its collectives match the other ranks'.
  last_step_handed_over = true;
  GradientHandover& h = algorithm->handover();
  if (!h.is_open()) open_window();
  PreparedGrads prepared;
  bool replicated = false;
  try {
    h.complete();
    parts.runner().wait();
    std::vector<uint8_t> present = h.received();
    const bool absent = std::find(present.begin(), present.end(), 0) != present.end();
    bool abandoned = abandon;
    const bool someone_absent = enter_collective(Call::Step, absent, &abandoned);
    if (abandoned)
      parts.pipeline().fail_step(LocalOutcome::invalid_if(
          abandon ? "this rank abandoned the step (dsopt_step with grads NULL and "
                    "num_grads < 0: a gradient it handed over, or should have, "
                    "was not usable); nothing was changed"
                  : ""));
    parts.absent().agree(someone_absent, algorithm->skips_absent(), std::move(present),
                         parts.agreement());
    replicated = check_replication(nullptr, -1);
    prepared = algorithm->prepare_handed_over();
  } catch (...) {
    parts.runner().wait_quietly();
    h.close();
    throw;
  }
  StepResult r = apply(std::move(prepared));
  r.grads_replicated = replicated;
  return r;
}

StepResult Optimizer::Impl::apply(PreparedGrads prepared) {
  StepPipeline& pipeline = parts.pipeline();
  bool compressed = false;
  if (!prepared.skip) {
    parts.groups().advance(parts.absent().inactive());
    try {
      const UpdateOutcome updated = algorithm->update(prepared);
      compressed = updated.compressed;
      pipeline.take_norm(prepared, updated);
    } catch (const Error& e) {
      mark_failed(e.status(), e.what());
      throw;
    } catch (const std::exception& e) {
      mark_failed(DSOPT_EINTERNAL, e.what());
      throw;
    }
    parts.divergence().observe(prepared.grad_norm, prepared.local_norm, parts.comm().size());
  }
  parts.absent().clear();
  const double scale_used = pipeline.scaler().scale();
  const bool stuck_at_min_scale = pipeline.finish(prepared);
  consecutive_skips = prepared.skip ? consecutive_skips + 1 : 0;
  StepResult r;
  r.skipped = prepared.skip;
  r.compressed = compressed;
  r.step = parts.group_step(0);
  r.loss_scale = pipeline.scaler().scale();
  r.grad_norm = pipeline.reports_norm() ? prepared.grad_norm : -1.0;
  r.diverging = parts.divergence().diverging();
  r.consecutive_skips = consecutive_skips;
  r.phase = prepared.skip ? DSOPT_PHASE_SKIPPED : algorithm->step_phase(compressed);
  r.alarm = alarm(stuck_at_min_scale, scale_used);
  return r;
}

void Optimizer::Impl::mark_failed(int status, const std::string& what) {
  failure_status = status;
  failure = "step " + std::to_string(parts.group_step(0)) +
            " failed after it had begun to change the state (" + what + ")";
}

void Optimizer::Impl::require_intact(const char* call) const {
  if (failure.empty()) return;
  fail(failure_status,
       std::string(call) + ": this optimizer's state is inconsistent: " + failure +
           "; its parameters and state may differ from any step's, and from the other ranks'. "
           "Destroy it (the only call it still takes besides read-only queries), then on every "
           "rank create a new communicator and optimizer and load the last state saved before "
           "the failure");
}

void Optimizer::require_intact(const char* call) const { impl_->require_intact(call); }

std::string Optimizer::Impl::alarm(bool stuck_at_min_scale, double scale_used) const {
  const int64_t limit = parts.config().pipeline.max_consecutive_skips;
  if (limit == 0 || consecutive_skips == 0) return "";
  const std::string hint = "; " + algorithm->divergence_hint();
  const std::string off = " (\"max_consecutive_skips\": 0 turns this error off)";
  if (stuck_at_min_scale)
    return "gradients overflow at the minimum loss scale " + std::to_string(scale_used) +
           " (fp16.min_loss_scale): the step was skipped and the scale cannot go lower; the "
           "gradients are Inf/NaN at any scale, so the run has diverged" + hint +
           ", or bf16 instead of fp16" + off;
  if (consecutive_skips < limit) return "";
  return std::to_string(consecutive_skips) +
         " steps in a row were skipped because some rank's gradients contained Inf or NaN "
         "(nothing has been updated since); the run has diverged or the loss is broken" +
         hint + off;
}

void Optimizer::Impl::refuse_while_handing_over(const char* call) {
  if (algorithm->handover().is_open())
    fail(DSOPT_EINVAL, std::string(call) + ": gradients of a step are being handed over with "
                       "dsopt_grad_ready; complete the step with dsopt_step(opt, NULL, 0, info) first "
                       "(nothing was changed)");
}

// ---- hyperparameters ----

int32_t Optimizer::num_groups() const { return impl_->parts.num_groups(); }
double Optimizer::lr(int32_t group) const { return impl_->parts.groups().lr(group); }
void Optimizer::set_lr(double lr) { impl_->parts.groups().set_lr(-1, lr); }
void Optimizer::set_group_lr(int32_t group, double lr) {
  HyperGroups& groups = impl_->parts.groups();
  groups.lr(group);  // range check first
  groups.set_lr(group, lr);
}
double Optimizer::group_param(int32_t group, const std::string& name) const {
  return impl_->parts.groups().group_param(group, name);
}
void Optimizer::set_group_param(int32_t group, const std::string& name, double value) {
  impl_->parts.groups().set_group_param(group, name, value);
}
double Optimizer::loss_scale() const { return impl_->parts.loss_scale(); }
double Optimizer::gradient_clipping() const {
  return impl_->parts.pipeline().config().gradient_clipping;
}

void Optimizer::set_gradient_clipping(double max_norm) {
  impl_->refuse_while_handing_over("dsopt_set_gradient_clipping");
  impl_->parts.pipeline().set_gradient_clipping(max_norm);
}

// ---- parameters ----

int64_t Optimizer::param_step(int64_t param_index) const {
  param_numel(param_index, nullptr);  // range check
  return impl_->parts.groups().param_step(param_index);
}

void Optimizer::set_param_step(int64_t param_index, int64_t step) {
  const Impl& s = *impl_;
  if (!s.algorithm->skips_absent())
    fail(DSOPT_EUNSUPPORTED, "dsopt_set_param_step: " + s.algorithm->blob_name() +
                                 "'s parameters all follow its steps applied (only the elementwise "
                                 "rules count steps per parameter: DSOPT_ALGORITHM_PARAM_STEPS of "
                                 "dsopt_algorithm_describe); nothing was changed");
  param_numel(param_index, nullptr);
  if (step < 0)
    fail(DSOPT_EINVAL, "dsopt_set_param_step: step must be >= 0, got " + std::to_string(step));
  impl_->parts.groups().set_param_step(param_index, step);
}

void Optimizer::set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) {
  impl_->algorithm->set_momentum_mask(param_index, mask);
}

// ---- creation ----

void Optimizer::created() {
  impl_->parts.find_topology();
  impl_->algorithm->created();
}
void Optimizer::set_run_id(uint64_t id) { impl_->parts.set_run_id(id); }
uint64_t Optimizer::params_fingerprint() const { return impl_->parts.params().fingerprint(); }
int Optimizer::threads() const { return impl_->parts.host_kernels().threads(); }

void Optimizer::set_default_threads(int threads) {
  const OptimizerParts& parts = impl_->parts;
  if (parts.config().threads > 0) return;  // the config's "threads" stays
  parts.host_kernels().set_threads(threads);
  if (parts.kernels().device() == Device::Cpu) parts.kernels().set_threads(threads);
}

}  // namespace dsopt
