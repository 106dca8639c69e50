// Group hyperparameters by name (dsopt_get_group_param /
// dsopt_set_group_param), as the algorithm's descriptor lists them
// (Algorithm::hyper). Every algorithm forms its per-step constants from
// group(g) at each step (adam_consts, onebit_consts, the stabilized momentum
// limit, 0/1 Adam's interval sums), so a value set here takes effect from the
// next step on.
#include <string>

#include "base/error.hpp"
#include "optim/algorithm.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {
namespace {

// The hyperparameter `name` of the algorithm (Lion has no eps).
const HyperParam& algorithm_param(const OptimizerConfig& cfg, const std::string& name) {
  const HyperParam* p = find_hyper(cfg.algorithm->hyper, name);
  if (!p)
    fail(DSOPT_EINVAL, cfg.type + " has no hyperparameter \"" + name + "\" (its hyperparameters are " +
                           hyper_names(cfg.algorithm->hyper) + "; nothing was changed)");
  return *p;
}

}  // namespace

double Optimizer::group_param(int32_t group, const std::string& name) const {
  lr(group);  // range check
  return algorithm_param(config(), name).get(groups_[size_t(group)]);
}

void Optimizer::set_group_param(int32_t group, const std::string& name, double value) {
  lr(group);  // range check
  const HyperParam& p = algorithm_param(config(), name);
  const std::string why = hyper_value_error(p, value);
  if (!why.empty())
    fail(DSOPT_EINVAL, name + " of group " + std::to_string(group) + " " + why + " (nothing was changed)");
  p.set(groups_[size_t(group)], value);
}

}  // namespace dsopt
