// Lion (docs/optimizers/lion.md): the rule of math/lion.hpp with one fp32
// moment, on every gradient path of the moment rules. Its keys and
// defaults are those of the paper's reference code: lr 1e-4, betas
// (0.9, 0.99), weight_decay 0.
#include "config/config_values.hpp"
#include "algorithms/registry.hpp"
#include "algorithms/moment_rules/moment_rule.hpp"
#include "optim/config.hpp"

namespace dsopt {
namespace {

Algorithm lion() {
  Algorithm a;
  a.type = "Lion";
  a.hyper = adam_hyper_params({"lr", "beta1", "beta2", "weight_decay"});  // no eps
  for (HyperParam& p : a.hyper) {
    if (p.name == "lr") p.dflt = 1e-4;
    if (p.name == "beta2") p.dflt = 0.99;
  }
  a.defaults.bias_correction = false;  // the constants are Adam's with lr as the step
  a.defaults.decoupled = true;
  a.rule = MomentRule::Elementwise;
  a.make = make_moment_rule;
  a.update = UpdateRule::Lion;
  a.moments = MomentNames("lion", {"exp_avg"});
  a.sharded = true;
  a.offload = true;
  a.read_params = [](const config::json&, const std::string&, OptimizerConfig&) {};
  a.write_params = [](const OptimizerConfig&, config::json&) {};
  return a;
}

}  // namespace

extern const Algorithm kLionAlgorithm = lion();

}  // namespace dsopt
