// Group hyperparameters by name (dsopt_get_group_param /
// dsopt_set_group_param), as the algorithm's descriptor lists them
// (Algorithm::hyper), and the blob's section of them besides the learning
// rates (common.hyper, laid out as optim/hyper_section.hpp says). Every
// algorithm forms its per-step constants from group(g) at each step
// (adam_consts, onebit_consts, the stabilized momentum limit, 0/1 Adam's
// interval sums), so a value set here takes effect from the next step on.
#include <string>

#include "base/error.hpp"
#include "optim/algorithm.hpp"
#include "optim/hyper_groups.hpp"
#include "optim/hyper_section.hpp"
#include "state/section_names.hpp"

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

double HyperGroups::group_param(int32_t group, const std::string& name) const {
  lr(group);  // range check
  return algorithm_param(config_, name).get(groups_[size_t(group)]);
}

void HyperGroups::set_group_param(int32_t group, const std::string& name, double value) {
  lr(group);  // range check
  const HyperParam& p = algorithm_param(config_, name);
  const std::string why = hyper_value_error(p, value);
  if (!why.empty())
    fail(DSOPT_EINVAL, name + " of group " + std::to_string(group) + " " + why + " (nothing was changed)");
  AdamHyper changed = groups_[size_t(group)];
  p.set(changed, value);
  const std::string conflict = config_.algorithm->check_group ? config_.algorithm->check_group(changed) : "";
  if (!conflict.empty())
    fail(DSOPT_EINVAL, name + " of group " + std::to_string(group) + " cannot be " + show_number(value) +
                           ": " + conflict + " (nothing was changed)");
  groups_[size_t(group)] = changed;
}

uint64_t HyperGroups::hyper_bytes(const BlobReader* r) const {
  return hyper_section_bytes(config_.algorithm->hyper, groups_.size(), r);
}

void HyperGroups::check_hyper_size(const BlobReader& r) const {
  if (r.has(kHyperSection))
    check_hyper_section_size(config_.algorithm->hyper, groups_.size(), r.section_size(kHyperSection));
}

void HyperGroups::write_hyper(FieldWriter& f) const {
  for (double v : hyper_section_values(config_.algorithm->hyper, groups_)) f.add(v);
}

void HyperGroups::check_hyper(FieldReader& f) const {
  const uint64_t size = f.remaining();
  read_hyper_values(config_.algorithm->hyper, f.take(size), size, groups_);
}

void HyperGroups::read_hyper(FieldReader& f) {
  const uint64_t size = f.remaining();
  groups_ = read_hyper_values(config_.algorithm->hyper, f.take(size), size, groups_);
}

}  // namespace dsopt
