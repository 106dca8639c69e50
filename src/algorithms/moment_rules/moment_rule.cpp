#include "algorithms/moment_rules/moment_rule.hpp"

#include "algorithms/lamb/lamb_coeffs.hpp"
#include "algorithms/moment_rules/replicated_optimizer.hpp"
#include "algorithms/moment_rules/zero_optimizer.hpp"

#include "base/error.hpp"

namespace dsopt {

bool has_moment_rule(const OptimizerConfig& cfg) {
  return cfg.algorithm && cfg.algorithm->rule != MomentRule::None;
}

MomentRule moment_rule(const OptimizerConfig& cfg) {
  if (!has_moment_rule(cfg)) fail(DSOPT_EINTERNAL, cfg.type + " has no moment rule");
  return cfg.algorithm->rule;
}

std::string moment_algorithm(const OptimizerConfig& cfg) {
  return cfg.algorithm->blob_name ? cfg.algorithm->blob_name(cfg) : cfg.type;
}

Algorithm elementwise_algorithm(const char* type, UpdateRule update, MomentNames moments) {
  Algorithm a;
  a.type = type;
  a.rule = MomentRule::Elementwise;
  a.update = update;
  a.make = make_moment_rule;
  a.moments = std::move(moments);
  a.sharded = true;
  a.offload = true;
  return a;
}

std::unique_ptr<AlgorithmImpl> make_moment_rule(OptimizerParts& parts) {
  if (parts.config().zero.stage > 0) return std::make_unique<ZeroOptimizer>(parts);
  return std::make_unique<ReplicatedOptimizer>(parts);
}

AdamStepConsts adam_step_consts(const OptimizerParts& parts) {
  const HyperGroups& g = parts.groups();
  return adam_step_consts(g.all_groups(), g.steps(), g.param_groups(), g.param_steps(),
                          parts.absent().inactive(), parts.config().algorithm->step_consts);
}

LambStepConsts lamb_step_consts(const OptimizerParts& parts) {
  const HyperGroups& g = parts.groups();
  LambStepConsts c;
  for (size_t i = 0; i < g.param_groups().size(); ++i) {
    const AdamHyper& h = g.group(g.param_groups()[i]);
    const int64_t t = g.param_step(int64_t(i));
    c.consts.emplace_back();
    static_cast<OneBitConsts&>(c.consts.back()) = onebit_consts(h, h.bias_correction, t, t);
    c.lr.push_back(h.lr);
  }
  return c;
}

double update_moments(const OptimizerParts& parts, MomentRule rule,
                      const std::vector<UpdateSlot>& slots,
                      const std::function<int64_t(size_t)>& param_of, const PreparedGrads& grads,
                      const TensorSums& sums) {
  if (rule == MomentRule::Lamb) {
    if (grads.norm_by_update) fail(DSOPT_EINTERNAL, "LAMB's update does not sum the gradients");
    std::vector<UpdateSlot> per_tensor = slots;  // constants are per parameter
    for (size_t k = 0; k < per_tensor.size(); ++k) per_tensor[k].group = int32_t(param_of(k));
    LambStepConsts c = lamb_step_consts(parts);
    lamb_step(parts.kernels(), per_tensor, c.consts, c.lr, grads.mul1, grads.mul2,
              lamb_coeffs(parts.config()), sums);
    return 0.0;
  }
  const UpdateRule update = parts.config().algorithm->update;
  const AdamStepConsts c = adam_step_consts(parts);
  const int32_t n = int32_t(c.consts.size());
  // Parameters with their own step counts, or some left out (their
  // gradients are zeros: leaving their sums out changes no bit).
  std::vector<UpdateSlot> selected;
  if (!c.of_param.empty()) selected = c.select(slots, param_of);
  const std::vector<UpdateSlot>& used = c.of_param.empty() ? slots : selected;
  // The sums in the order of the step pipeline's pass: tensor by tensor.
  std::vector<double> grad_sums(grads.norm_by_update ? used.size() : 0);
  parts.kernels().update(update, used.data(), int64_t(used.size()), c.consts.data(), n,
                         grads.mul1, grads.mul2, grads.norm_by_update ? grad_sums.data() : nullptr);
  double sumsq = 0.0;
  for (double s : grad_sums) sumsq += s;
  return sumsq;
}

}  // namespace dsopt
