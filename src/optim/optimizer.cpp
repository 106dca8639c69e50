#include "optim/optimizer.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "base/error.hpp"

namespace dsopt {
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
      groups_(cfg_, params_),
      absent_(*kernels_, params_),
      handshake_(comm, agreement_, cfg.pipeline.comm_timeout_s),
      replication_(*kernels_),
      divergence_(cfg.pipeline.divergence),
      io_(comm, params_, *kernels_, CommonState{groups_, pipeline_.scaler(), run_id_, divergence_},
          [this] { return algorithm(); }, [this](StateSchema& s) { describe_state(s); }),
      gathers_(cfg.zero.deferred_allgather, comm, runner_, *kernels_,
               [this](int status, const std::string& what) { mark_failed(status, what); }) {}

Optimizer::~Optimizer() { stop_reductions(); }

std::vector<uint8_t> Optimizer::averaged_flags() const {
  std::vector<uint8_t> average(size_t(params_.count()));
  for (int64_t i = 0; i < params_.count(); ++i) average[size_t(i)] = averaged(i) ? 1 : 0;
  return average;
}

PreparedGrads Optimizer::prepare(const dsopt_tensor* grads, int64_t count) {
  return pipeline_.prepare(grads, count, averaged_flags(), update_sums());
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

StepResult Optimizer::step(const dsopt_tensor* grads, int64_t count) {
  // Handed-over gradients: the step's traffic began with the first one.
  // (While they are, reductions run on dsopt's thread: the communicator's
  // count is read only once the step has waited for them.)
  const uint64_t sent_before = handing_over() ? handover_bytes_start_ : comm_.bytes_sent();
  StepResult r = step_uncounted(grads, count);
  // Deferred gathers count as they run on dsopt's thread: their bytes are
  // known in advance.
  r.bytes_sent = gathers_.bytes_sent_since(sent_before);
  return r;
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
  const dsopt_tensor* filled = absent_.fill(grads, count, present);
  const bool absent = std::find(present.begin(), present.end(), 0) != present.end();
  absent_.agree(enter_collective(Call::Step, absent), skips_absent(), std::move(present), agreement_);
  const bool replicated = check_replication(grads, std::max<int64_t>(count, 0));
  StepResult r = apply(prepare(filled, count));
  r.grads_replicated = replicated;
  return r;
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
    absent_.agree(someone_absent, skips_absent(), std::move(present), agreement_);
    replicated = check_replication(nullptr, -1);
    prepared = prepare_handed_over();
  } catch (...) {
    runner_.wait_quietly();
    h.close();
    throw;
  }
  StepResult r = apply(std::move(prepared));
  r.grads_replicated = replicated;
  return r;
}

StepResult Optimizer::apply(PreparedGrads prepared) {
  bool compressed = false;
  if (!prepared.skip) {
    groups_.advance(absent_.inactive());
    try {
      const UpdateOutcome updated = update(prepared);
      compressed = updated.compressed;
      pipeline_.take_norm(prepared, updated);
    } catch (const Error& e) {
      mark_failed(e.status(), e.what());
      throw;
    } catch (const std::exception& e) {
      mark_failed(DSOPT_EINTERNAL, e.what());
      throw;
    }
    divergence_.observe(prepared.grad_norm, prepared.local_norm, comm_.size());
  }
  absent_.clear();
  const double scale_used = pipeline_.scaler().scale();
  const bool stuck_at_min_scale = pipeline_.finish(prepared);
  consecutive_skips_ = prepared.skip ? consecutive_skips_ + 1 : 0;
  StepResult r;
  r.skipped = prepared.skip;
  r.compressed = compressed;
  r.step = groups_.group_step(0);
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
  failure_ = "step " + std::to_string(groups_.group_step(0)) + " failed after it had begun to change the state (" +
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
  return groups_.param_step(param_index);
}

void Optimizer::set_param_step(int64_t param_index, int64_t step) {
  if (!skips_absent())
    fail(DSOPT_EUNSUPPORTED, "dsopt_set_param_step: " + algorithm() +
                                 "'s parameters all follow its steps applied (only the elementwise "
                                 "rules count steps per parameter: DSOPT_ALGORITHM_PARAM_STEPS of "
                                 "dsopt_algorithm_describe); nothing was changed");
  param_numel(param_index, nullptr);
  if (step < 0)
    fail(DSOPT_EINVAL, "dsopt_set_param_step: step must be >= 0, got " + std::to_string(step));
  groups_.set_param_step(param_index, step);
}

void Optimizer::set_momentum_mask(int64_t, const dsopt_tensor*) {
  fail(DSOPT_EUNSUPPORTED, "dsopt_set_momentum_mask: " + algorithm() +
                               " has no momentum mask (only the 1-bit optimizers do)");
}

void Optimizer::refuse_while_handing_over(const char* call) {
  if (handover().is_open())
    fail(DSOPT_EINVAL, std::string(call) + ": gradients of a step are being handed over with "
                       "dsopt_grad_ready; complete the step with dsopt_step(opt, NULL, 0, info) first "
                       "(nothing was changed)");
}

}  // namespace dsopt
