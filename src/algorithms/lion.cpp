// Lion (docs/optimizers/lion.md): the rule of math/lion.hpp with one fp32
// moment, on every gradient path of the moment rules. Its keys and
// defaults are those of the paper's reference code: lr 1e-4, betas
// (0.9, 0.99), weight_decay 0.
#include "algorithms/config_values.hpp"
#include "algorithms/registry.hpp"
#include "optim/config.hpp"

namespace dsopt {
namespace {

Algorithm lion() {
  Algorithm a;
  a.type = "Lion";
  a.hyper = {"lr", "betas", "weight_decay"};
  a.defaults.lr = 1e-4;
  a.defaults.beta1 = 0.9;
  a.defaults.beta2 = 0.99;
  a.defaults.weight_decay = 0.0;
  a.defaults.bias_correction = false;  // the constants are Adam's with lr as the step
  a.defaults.decoupled = true;
  a.rule = MomentRule::Elementwise;
  a.update = UpdateRule::Lion;
  a.moments = 1;
  a.moments_prefix = "lion";
  a.sharded = true;
  a.offload = true;
  a.read_params = [](const config::json& params, const std::string& path, OptimizerConfig& cfg) {
    config::read_hyper(params, path, cfg.defaults);
  };
  a.write_params = [](const OptimizerConfig&, config::json&) {};
  return a;
}

}  // namespace

extern const Algorithm kLionAlgorithm = lion();

}  // namespace dsopt
