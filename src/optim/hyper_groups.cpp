#include "optim/hyper_groups.hpp"

#include <string>

#include "base/error.hpp"

namespace dsopt {

HyperGroups::HyperGroups(const OptimizerConfig& config, const ParamSet& params)
    : config_(config),
      groups_(config.groups),
      steps_(config.groups.size(), 0),
      param_steps_(size_t(params.count()), 0) {
  for (const Param& p : params.params()) param_groups_.push_back(p.group);
}

double HyperGroups::lr(int32_t group) const {
  if (group < 0 || group >= num_groups())
    fail(DSOPT_EINVAL, "group " + std::to_string(group) + " is out of range (the optimizer has " +
                           std::to_string(num_groups()) + ")");
  return groups_[size_t(group)].lr;
}

void HyperGroups::set_lr(int32_t group, double lr) {
  if (group == -1) {
    for (AdamHyper& g : groups_) g.lr = lr;
    return;
  }
  this->lr(group);  // range check
  groups_[size_t(group)].lr = lr;
}

void HyperGroups::advance(const std::vector<uint8_t>& inactive) {
  for (int64_t& s : steps_) ++s;
  for (size_t i = 0; i < param_steps_.size(); ++i)
    if (inactive.empty() || !inactive[i]) ++param_steps_[i];
}

void HyperGroups::write_lrs(FieldWriter& f) const {
  for (const AdamHyper& g : groups_) f.add(g.lr);
}

void HyperGroups::read_lrs(FieldReader& f) {
  for (AdamHyper& g : groups_) g.lr = f.get<double>();
}

void HyperGroups::param_steps_from_groups() {
  for (size_t i = 0; i < param_steps_.size(); ++i) param_steps_[i] = steps_[size_t(param_groups_[i])];
}

}  // namespace dsopt
