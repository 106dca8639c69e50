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
  Algorithm a = elementwise_algorithm("Lion", UpdateRule::Lion, MomentNames("lion", {"exp_avg"}));
  a.hyper = adam_hyper_params({"lr", "beta1", "beta2", "weight_decay"});  // no eps
  for (HyperParam& p : a.hyper) {
    if (p.name == "lr") p.dflt = 1e-4;
    if (p.name == "beta2") p.dflt = 0.99;
  }
  a.defaults.bias_correction = false;  // the constants are Adam's with lr as the step
  a.defaults.decoupled = true;
  return a;
}

}  // namespace

extern const Algorithm kLionAlgorithm = lion();

}  // namespace dsopt
