// LAMB (docs/optimizers/lamb.md): DeepSpeed's FusedLamb keys, with the
// update of 1-bit LAMB's warmup.
#include "config/config_values.hpp"
#include "algorithms/lamb/lamb_coeffs.hpp"
#include "algorithms/registry.hpp"
#include "algorithms/moment_rules/moment_rule.hpp"
#include "optim/config.hpp"

namespace dsopt {

using namespace config;

void read_lamb_coeffs(const json& params, const std::string& path, LambCoeffConfig& k) {
  k.max_coeff = number(params, path, "max_coeff", k.max_coeff);
  k.min_coeff = number(params, path, "min_coeff", k.min_coeff);
  require(k.min_coeff > 0, sub(path, "min_coeff"), "must be > 0");
  require(k.max_coeff >= k.min_coeff, sub(path, "max_coeff"), "must be >= min_coeff");
  k.coeff_beta = number(params, path, "coeff_beta", k.coeff_beta);
  require(k.coeff_beta >= 0 && k.coeff_beta < 1, sub(path, "coeff_beta"), "must be in [0, 1)");
  k.factor_max = number(params, path, "factor_max", k.factor_max);
  k.factor_min = number(params, path, "factor_min", k.factor_min);
  require(k.factor_min > 0, sub(path, "factor_min"), "must be > 0");
  require(k.factor_max >= k.factor_min, sub(path, "factor_max"), "must be >= factor_min");
  k.factor_threshold = number(params, path, "factor_threshold", k.factor_threshold);
  require(k.factor_threshold >= 0, sub(path, "factor_threshold"), "must be >= 0");
}

void write_lamb_coeffs(const LambCoeffConfig& k, bool onebit, json& p) {
  p.update({{"max_coeff", k.max_coeff}, {"min_coeff", k.min_coeff}});
  if (onebit)
    p.update({{"coeff_beta", k.coeff_beta}, {"factor_max", k.factor_max},
              {"factor_min", k.factor_min}, {"factor_threshold", k.factor_threshold}});
}

namespace {

void read_lamb(const json& params, const std::string& path, OptimizerConfig& cfg) {
  if (params.contains("max_grad_norm"))
    bad(sub(path, "max_grad_norm"), "is not used by dsopt's LAMB; clip with the top-level "
                                    "\"gradient_clipping\"");
  if (boolean(params, path, "eps_inside_sqrt", false))
    bad(sub(path, "eps_inside_sqrt"), "eps is always added outside the square root");
  cfg.defaults.bias_correction = boolean(params, path, "bias_correction", true);
  cfg.defaults.decoupled = true;
  auto settings = std::make_shared<LambSettings>();
  read_lamb_coeffs(params, path, settings->coeffs);
  cfg.settings = settings;
}

void write_lamb(const OptimizerConfig& c, json& p) {
  p["bias_correction"] = c.defaults.bias_correction;
  write_lamb_coeffs(lamb_coeffs(c), false, p);
}

Algorithm lamb() {
  Algorithm a;
  a.type = "Lamb";
  a.keys = {"bias_correction", "max_coeff", "min_coeff", "max_grad_norm", "eps_inside_sqrt", "amsgrad"};
  a.rule = MomentRule::Lamb;
  a.make = make_moment_rule;
  a.moments = MomentNames("lamb");
  a.sharded = true;
  a.read_params = read_lamb;
  a.write_params = write_lamb;
  return a;
}

}  // namespace

extern const Algorithm kLambAlgorithm = lamb();

}  // namespace dsopt
