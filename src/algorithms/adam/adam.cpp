// Adam and AdamW (docs/optimizers/adam.md): DeepSpeed's FusedAdam keys.
#include "config/config_values.hpp"
#include "algorithms/registry.hpp"
#include "algorithms/moment_rules/moment_rule.hpp"
#include "optim/config.hpp"

namespace dsopt {
namespace {

using namespace config;

void read_adam(const json& params, const std::string& path, OptimizerConfig& cfg, bool always_decoupled) {
  cfg.defaults.bias_correction = boolean(params, path, "bias_correction", true);
  const bool adam_w_mode = boolean(params, path, "adam_w_mode", true);
  if (always_decoupled && !adam_w_mode)
    bad(sub(path, "adam_w_mode"), "AdamW always decouples weight decay; use \"type\": \"Adam\" with "
                                  "\"adam_w_mode\": false for L2 weight decay");
  cfg.defaults.decoupled = adam_w_mode;
}

void write_adam(const OptimizerConfig& c, json& p) {
  p["bias_correction"] = c.defaults.bias_correction;
  p["adam_w_mode"] = c.defaults.decoupled;
}

Algorithm adam(const char* type, bool always_decoupled) {
  Algorithm a = elementwise_algorithm(type, UpdateRule::Adam, MomentNames("adam"));
  a.keys = {"bias_correction", "adam_w_mode", "amsgrad"};
  // Adam with decoupled weight decay saves as AdamW: the same state.
  a.blob_name = [](const OptimizerConfig& c) { return std::string(c.defaults.decoupled ? "AdamW" : "Adam"); };
  a.read_params = always_decoupled
                      ? [](const json& p, const std::string& path, OptimizerConfig& c) { read_adam(p, path, c, true); }
                      : [](const json& p, const std::string& path, OptimizerConfig& c) { read_adam(p, path, c, false); };
  a.write_params = write_adam;
  return a;
}

}  // namespace

extern const Algorithm kAdamAlgorithm = adam("Adam", false);
extern const Algorithm kAdamWAlgorithm = adam("AdamW", true);

}  // namespace dsopt
