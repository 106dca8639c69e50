// Group hyperparameters by name (dsopt_get_group_param /
// dsopt_set_group_param), and the blob's section of them besides the
// learning rates (common.hyper). Every algorithm forms its per-step constants from
// group(g) at each step (adam_consts, onebit_consts, the stabilized momentum
// limit, 0/1 Adam's interval sums), so a value set here takes effect from the
// next step on.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.hpp"
#include "optim/hyper_groups.hpp"

namespace dsopt {
namespace {

// One settable field of AdamHyper, the config key it comes from and the
// values it accepts.
struct HyperField {
  const char* name;
  const char* key;  // among the algorithm's hyperparameters (Algorithm::hyper)
  double AdamHyper::*field;
  bool beta;  // in [0, 1); otherwise finite and >= 0
};

constexpr HyperField kFields[] = {
    {"lr", "lr", &AdamHyper::lr, false},
    {"beta1", "betas", &AdamHyper::beta1, true},
    {"beta2", "betas", &AdamHyper::beta2, true},
    {"eps", "eps", &AdamHyper::eps, false},
    {"weight_decay", "weight_decay", &AdamHyper::weight_decay, false},
};

constexpr const char* kValidNames = "\"lr\", \"beta1\", \"beta2\", \"eps\", \"weight_decay\"";

// The shortest text that reads back as `v` (1e-08 stays 1e-08, and
// 1.0000001 does not print as 1).
std::string show(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

const HyperField& field(const std::string& name) {
  for (const HyperField& f : kFields)
    if (name == f.name) return f;
  fail(DSOPT_EINVAL, "unknown group hyperparameter \"" + name + "\"; the names are " + kValidNames);
}

void check_value(const HyperField& f, int32_t group, double value) {
  const std::string what = std::string(f.name) + " of group " + std::to_string(group);
  if (f.beta && !(value >= 0.0 && value < 1.0))
    fail(DSOPT_EINVAL, what + " must be in [0, 1), got " + show(value) + " (nothing was changed)");
  // The update runs in fp32: a beta that rounds to 1 there would stop the
  // moment it belongs to and divide by zero in the bias correction.
  if (f.beta && !(float(value) < 1.0f))
    fail(DSOPT_EINVAL, what + " is " + show(value) + ", which is 1 in fp32 (the update's "
                           "precision); use at most 0.99999994 (nothing was changed)");
  if (!f.beta && !(std::isfinite(value) && value >= 0.0))
    fail(DSOPT_EINVAL, what + " must be a finite number >= 0, got " + show(value) +
                           " (nothing was changed)");
}

bool has_key(const OptimizerConfig& cfg, const HyperField& f) {
  const std::vector<std::string>& hyper = cfg.algorithm->hyper;
  return std::find(hyper.begin(), hyper.end(), f.key) != hyper.end();
}

// The field `name` of an algorithm that has it (Lion has no eps).
const HyperField& algorithm_field(const OptimizerConfig& cfg, const std::string& name) {
  const HyperField& f = field(name);
  if (!has_key(cfg, f))
    fail(DSOPT_EINVAL, cfg.type + " has no hyperparameter \"" + name + "\" (nothing was changed)");
  return f;
}

}  // namespace

bool HyperGroups::has_group_param(const std::string& name) const { return has_key(config_, field(name)); }

double HyperGroups::group_param(int32_t group, const std::string& name) const {
  lr(group);  // range check
  return groups_[size_t(group)].*algorithm_field(config_, name).field;
}

void HyperGroups::set_group_param(int32_t group, const std::string& name, double value) {
  lr(group);  // range check
  const HyperField& f = algorithm_field(config_, name);
  check_value(f, group, value);
  groups_[size_t(group)].*f.field = value;
}

void HyperGroups::write_hyper(FieldWriter& f) const {
  for (const AdamHyper& g : groups_) f.add(g.beta1).add(g.beta2).add(g.eps).add(g.weight_decay);
}

void HyperGroups::read_hyper(FieldReader& f) {
  for (AdamHyper& g : groups_) {
    g.beta1 = f.get<double>();
    g.beta2 = f.get<double>();
    g.eps = f.get<double>();
    g.weight_decay = f.get<double>();
  }
}

}  // namespace dsopt
