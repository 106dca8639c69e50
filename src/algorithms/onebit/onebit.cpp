// The 1-bit optimizers (docs/optimizers/): 1-bit Adam, 1-bit LAMB and
// 0/1 Adam, with DeepSpeed's keys and dsopt's stabilized compression stage.
#include "config/config_values.hpp"
#include "algorithms/lamb/lamb_coeffs.hpp"
#include "algorithms/onebit/onebit_settings.hpp"
#include "algorithms/registry.hpp"
#include "algorithms/onebit/onebit_adam.hpp"
#include "algorithms/onebit/onebit_lamb.hpp"
#include "algorithms/onebit/zero_one_adam.hpp"

namespace dsopt {
namespace {

using namespace config;

// stabilize_limit's default, measured: 4 for every 1-bit optimizer. For 1-bit
// LAMB and 0/1 Adam the smallest of 1, 2, 4 at which their stabilized runs
// match DeepSpeed's where DeepSpeed's rule is healthy
// (docs/design/stable-1bit.md); for 1-bit Adam, compressing in the update's
// units, the limit at which it matches AdamW on the small GPTs and the MLPs
// (docs/design/zero-one-adam-transformers.md).
constexpr double kDefaultStabilizeLimit = 4.0;

// The keys the 1-bit optimizers share. 1-bit Adam and 0/1 Adam correct
// both moments by default (false: DeepSpeed's rule). 1-bit LAMB accepts
// bias_correction and ignores it (`corrects` false): its trust ratio
// cancels a per-tensor factor. eps_inside_sqrt is accepted and ignored:
// eps is always outside the square root.
void read_onebit(const json& params, const std::string& path, OptimizerConfig& cfg, bool corrects,
                 OneBitSettings& s) {
  if (params.contains("max_grad_norm"))
    bad(sub(path, "max_grad_norm"), "is not used by 1-bit optimizers (DeepSpeed ignores it); "
                                    "clip with the top-level \"gradient_clipping\"");
  const bool corrected = boolean(params, path, "bias_correction", true);
  cfg.defaults.bias_correction = corrects && corrected;
  boolean(params, path, "eps_inside_sqrt", false);
  cfg.defaults.decoupled = true;
  s.freeze_step = integer(params, path, "freeze_step", 100000, 1, int64_t(1) << 62);
  s.stabilize = boolean(params, path, "stabilize", true);
  s.stabilize_limit = number(params, path, "stabilize_limit", kDefaultStabilizeLimit);
  require(s.stabilize_limit > 0, sub(path, "stabilize_limit"),
          "must be > 0, got " + std::to_string(s.stabilize_limit));
  require_fp32(s.stabilize_limit, sub(path, "stabilize_limit"), true);
}

// read_onebit into a new settings object of type S, kept by the config.
template <class S>
S& read_settings(const json& params, const std::string& path, OptimizerConfig& cfg, bool corrects) {
  auto s = std::make_shared<S>();
  read_onebit(params, path, cfg, corrects, *s);
  cfg.settings = s;
  return *s;
}

void write_stabilize(const OptimizerConfig& c, json& p) {
  const OneBitSettings& s = c.settings_as<OneBitSettings>();
  p["stabilize"] = s.stabilize;
  p["stabilize_limit"] = s.stabilize_limit;
}

// 0/1 Adam's schedules (docs/design/zero-one-adam.md section 1).
void read_zero_one(const json& params, const std::string& path, OptimizerConfig& cfg) {
  ZeroOneSettings& s = read_settings<ZeroOneSettings>(params, path, cfg, true);
  const int64_t big = int64_t(1) << 62;
  s.var_freeze_step = integer(params, path, "var_freeze_step", 100000, 0, big);
  s.var_update_scaler = integer(params, path, "var_update_scaler", 16, 1, big);
  s.local_step_scaler = integer(params, path, "local_step_scaler", 32678, 1, big);
  s.local_step_clipper = integer(params, path, "local_step_clipper", 16, 1, big);
  s.decoupled_sync_weight_decay = boolean(params, path, "decoupled_sync_weight_decay", false);
}

template <class Impl>
std::unique_ptr<AlgorithmImpl> make(OptimizerParts& parts) {
  return std::make_unique<Impl>(parts);
}

Algorithm onebit(const char* type, const char* moments) {
  Algorithm a;
  a.type = type;
  a.moments = MomentNames(moments);
  a.compresses = true;
  a.keys = {"freeze_step", "bias_correction", "eps_inside_sqrt", "amsgrad", "max_grad_norm",
            "stabilize", "stabilize_limit"};
  return a;
}

Algorithm onebit_adam() {
  Algorithm a = onebit("OneBitAdam", "onebit");
  a.group_keys = {"non_freeze"};
  a.read_params = [](const json& p, const std::string& path, OptimizerConfig& c) {
    read_settings<OneBitSettings>(p, path, c, true);
  };
  a.write_params = [](const OptimizerConfig& c, json& p) {
    p["bias_correction"] = c.defaults.bias_correction;
    p["freeze_step"] = c.settings_as<OneBitSettings>().freeze_step;
    write_stabilize(c, p);
  };
  a.make = make<OneBitAdam>;
  return a;
}

Algorithm onebit_lamb() {
  Algorithm a = onebit("OneBitLamb", "lamb");
  a.keys.insert(a.keys.end(), {"max_coeff", "min_coeff", "coeff_beta", "factor_max", "factor_min",
                               "factor_threshold"});
  a.read_params = [](const json& p, const std::string& path, OptimizerConfig& c) {
    read_lamb_coeffs(p, path, read_settings<OneBitLambSettings>(p, path, c, false).coeffs);
  };
  a.write_params = [](const OptimizerConfig& c, json& p) {
    p["freeze_step"] = c.settings_as<OneBitSettings>().freeze_step;
    write_stabilize(c, p);
    write_lamb_coeffs(lamb_coeffs(c), true, p);
  };
  a.make = make<OneBitLamb>;
  return a;
}

Algorithm zero_one_adam() {
  Algorithm a = onebit("ZeroOneAdam", "zoadam");
  a.keys.erase(a.keys.begin());  // freeze_step: its schedules replace it
  a.keys.insert(a.keys.end(), {"var_freeze_step", "var_update_scaler", "local_step_scaler",
                               "local_step_clipper", "decoupled_sync_weight_decay"});
  a.read_params = read_zero_one;
  a.write_params = [](const OptimizerConfig& c, json& p) {
    p["bias_correction"] = c.defaults.bias_correction;
    write_stabilize(c, p);
    const ZeroOneSettings& s = c.settings_as<ZeroOneSettings>();
    p.update({{"var_freeze_step", s.var_freeze_step}, {"var_update_scaler", s.var_update_scaler},
              {"local_step_scaler", s.local_step_scaler}, {"local_step_clipper", s.local_step_clipper},
              {"decoupled_sync_weight_decay", s.decoupled_sync_weight_decay}});
  };
  a.make = make<ZeroOneAdam>;
  return a;
}

}  // namespace

extern const Algorithm kOneBitAdamAlgorithm = onebit_adam();
extern const Algorithm kOneBitLambAlgorithm = onebit_lamb();
extern const Algorithm kZeroOneAdamAlgorithm = zero_one_adam();

}  // namespace dsopt
