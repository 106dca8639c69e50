#include "optim/step_pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/error.hpp"

namespace dsopt {

StepPipeline::StepPipeline(const PipelineConfig& cfg, Comm& comm, Kernels& kernels,
                           const Mem& mem, const ParamSet& params,
                           CommRunner& runner, RankAgreement& agreement, int64_t bucket_elems)
    : cfg_(cfg), comm_(comm), kernels_(kernels), mem_(mem), params_(params),
      scaler_(cfg.loss_scale), packed_(comm, kernels, mem, runner, params, bucket_elems),
      runner_(runner), agreement_(agreement), shards_(comm) {}

std::vector<TensorRef> StepPipeline::caller_grads(const dsopt_tensor* grads, int64_t count) const {
  std::vector<TensorRef> refs;
  refs.reserve(size_t(count));
  for (int64_t i = 0; i < count; ++i)
    refs.push_back(TensorRef{grads[i].data, grads[i].numel, DType(grads[i].dtype)});
  return refs;
}

void StepPipeline::fail_step(const LocalOutcome& mine) {
  agreement_.fail(kStepFailure, mine);
}

double StepPipeline::norm_of(double sumsq) const { return std::sqrt(sumsq) / scaler_.scale(); }

void StepPipeline::set_multipliers(PreparedGrads& out, double sumsq) const {
  double coef = 1.0;
  if (wants_norm() && !out.norm_by_update) {
    out.grad_norm = norm_of(sumsq);
    if (cfg_.gradient_clipping > 0.0)
      coef = std::min(1.0, cfg_.gradient_clipping / (out.grad_norm + 1e-6));
  }
  out.mul2 = float(coef / scaler_.scale());
}

bool StepPipeline::norm_after_update(bool update_sums, int micro_batches) const {
  return update_sums && comm_.size() == 1 && !shards_.active() && micro_batches == 1 && wants_norm() &&
         !reports_norm() && kernels_.sums_while_updating();
}

void StepPipeline::take_norm(PreparedGrads& prepared, const UpdateOutcome& updated) const {
  if (prepared.norm_by_update) prepared.grad_norm = norm_of(updated.grad_sumsq);
}

PreparedGrads StepPipeline::prepare(const dsopt_tensor* grads, int64_t count,
                                    const std::vector<uint8_t>& averaged, bool update_sums) {
  const int world = comm_.size();
  const std::string local_error = params_.check_grads(grads, count);
  if (world == 1 && !shards_.active() && !local_error.empty())
    fail(DSOPT_EINVAL, "dsopt_step: " + local_error);
  LocalOutcome mine = LocalOutcome::invalid_if(local_error);
  // Replicas of sharded parameters: a rank whose shard group failed fails
  // over comm too, so that every rank of both learns of it below.
  if (world > 1) mine = shards_.agree_valid(mine);
  const bool ok = mine.ok();

  PreparedGrads out;
  if (ok) {
    out.grads = caller_grads(grads, count);
  } else {  // sizes from the parameters, so this rank's collectives match the others'
    out.grads.reserve(params_.params().size());
    for (const Param& p : params_.params()) out.grads.push_back(TensorRef{nullptr, p.numel, DType::F32});
  }
  GradientHandover::Plan plan = packed_.plan(averaged);
  std::vector<TensorRef> local_refs;
  local_refs.reserve(out.grads.size());
  for (size_t i = 0; i < out.grads.size(); ++i)
    if (!plan.bucketed[i]) local_refs.push_back(out.grads[i]);
  bool nonfinite = false;
  double local_sumsq = 0.0, avg_sumsq = 0.0;
  out.norm_by_update = norm_after_update(update_sums, 1);
  const bool sums_here = wants_norm() && !out.norm_by_update;

  // Gradients that stay local are checked (and summed) where they lie.
  if (ok && !local_refs.empty() && (cfg_.skip_nonfinite || sums_here)) {
    std::vector<double> sums(local_refs.size(), 0.0);
    nonfinite = kernels_.transform(local_refs.data(), int64_t(local_refs.size()), 1.0f, nullptr,
                                   sums_here ? sums.data() : nullptr).nonfinite;
    for (double v : sums) local_sumsq += v;
  }

  const bool any_averaged = !plan.bucket_ends.empty();
  if (any_averaged) {
    // Averaged gradients -> the packing (checked on the way), bucket by
    // bucket, each bucket's allreduce started once it is packed; the status
    // flag travels in the bucket reduced last.
    packed_.open(std::move(plan), 1);  // not used here after this
    packed_.set_status(float(RankAgreement::status_value(ok, nonfinite)));
    if (ok) packed_.hand_over_bucketed(out.grads.data());
    packed_.complete();
    packed_.close();
    runner_.wait();
    nonfinite = finish_averaged(out, 1.0f / float(world), mine, &avg_sumsq);
  }

  // Ranks agree on status and on sqrt(mean_i ||g_i||^2) of the local part
  // through one small allreduce, unless the gradient allreduce said it all.
  if (world > 1 && (!any_averaged || (!local_refs.empty() && wants_norm())))
    nonfinite = agree(nonfinite, &local_sumsq, mine);

  out.local_norm = world > 1 && !local_refs.empty();
  // At one rank of comm a bad argument is settled over the shard group.
  finish_prepared(out, nonfinite, avg_sumsq + local_sumsq, world == 1 ? mine : LocalOutcome{});
  return out;
}

void StepPipeline::finish_prepared(PreparedGrads& out, bool nonfinite, double sumsq,
                                   const LocalOutcome& mine) {
  if (shards_.active()) nonfinite = shards_.settle_step(mine, nonfinite, &sumsq);
  out.skip = nonfinite && cfg_.skip_nonfinite;
  set_multipliers(out, sumsq);
}

void StepPipeline::open_handover(const std::vector<uint8_t>& averaged, int micro_batches) {
  packed_.open(packed_.plan(averaged), micro_batches);
  packed_.set_status(0.0f);
}

PreparedGrads StepPipeline::prepare_handed_over(bool update_sums) {
  const int world = comm_.size();
  const GradientHandover::Plan& plan = packed_.plan_in_use();
  const int micro_batches = packed_.micro_batches();
  PreparedGrads out;
  out.norm_by_update = norm_after_update(update_sums, micro_batches);
  const bool sums_here = wants_norm() && !out.norm_by_update;
  std::vector<size_t> local;
  for (size_t i = 0; i < plan.pos.size(); ++i) {
    out.grads.push_back(TensorRef{packed_.data() + plan.pos[i], plan.numel[i], DType::F32});
    if (!plan.bucketed[i]) local.push_back(i);
  }
  bool nonfinite = packed_.nonfinite();
  double local_sumsq = 0.0, avg_sumsq = 0.0;
  // The local part: the mean over micro-batches in place (checked again:
  // a sum of finite values can overflow), and its sums of squares, tensor
  // by tensor as dsopt_step sums them.
  if (!local.empty() && (micro_batches > 1 || sums_here)) {
    const float inv_micro = 1.0f / float(micro_batches);
    for (size_t i : local) {
      double sum = 0.0;
      float* g = packed_.data() + plan.pos[i];
      nonfinite |= kernels_.transform(&out.grads[i], 1, inv_micro, micro_batches > 1 ? g : nullptr,
                                      sums_here ? &sum : nullptr).nonfinite;
      local_sumsq += sum;
    }
  }
  const bool any_averaged = !plan.bucket_ends.empty();
  if (any_averaged)
    nonfinite |= finish_averaged(out, 1.0f / (float(world) * float(micro_batches)), LocalOutcome{},
                                 &avg_sumsq);
  if (world > 1 && (!any_averaged || !local.empty()))
    nonfinite = agree(nonfinite, &local_sumsq, LocalOutcome{});
  packed_.close();
  out.local_norm = world > 1 && !local.empty();
  finish_prepared(out, nonfinite, avg_sumsq + local_sumsq, LocalOutcome{});
  return out;
}

bool StepPipeline::finish_averaged(PreparedGrads& out, float mul, const LocalOutcome& mine,
                                   double* sumsq) {
  const GradientHandover::Plan& plan = packed_.plan_in_use();
  float* buf = packed_.data();
  float flag = 0.0f;
  kernels_.copy_to_host(&flag, buf, 4);
  if (RankAgreement::some_rank_failed(flag)) fail_step(mine);
  bool nonfinite = flag > 0.0f;
  // a = fl(sum * mul), in place; the sums are checked as well. The
  // averaged gradients follow the status slot up to the last bucket's end.
  const TensorRef whole{buf + 1, plan.bucket_ends.back() - 1, DType::F32};
  nonfinite |= kernels_.transform(&whole, 1, mul, buf + 1, wants_norm() ? sumsq : nullptr).nonfinite;
  for (size_t i = 0; i < plan.pos.size(); ++i)
    if (plan.bucketed[i]) out.grads[i] = TensorRef{buf + plan.pos[i], plan.numel[i], DType::F32};
  return nonfinite;
}

bool StepPipeline::agree(bool nonfinite, double* local_sumsq, const LocalOutcome& mine) {
  nonfinite = agreement_.settle_sum(kStepFailure, mine, nonfinite,
                                    local_sumsq);
  *local_sumsq /= comm_.size();
  return nonfinite;
}

}  // namespace dsopt
