// Hyperparameter groups (G8): each group's hyperparameters (AdamHyper) and
// step counter, each parameter's group and update count, the named access
// of dsopt_get/set_group_param (group_params.cpp) and the per-step
// constants the update rules read from them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "optim/config.hpp"
#include "params/param_set.hpp"
#include "state/blob.hpp"

namespace dsopt {

class HyperGroups {
 public:
  // The config's groups; `config` outlives this object.
  HyperGroups(const OptimizerConfig& config, const ParamSet& params);

  int32_t num_groups() const { return int32_t(groups_.size()); }
  // Throws Error(DSOPT_EINVAL) for a group out of range.
  double lr(int32_t group) const;
  void set_lr(int32_t group, double lr);  // group -1: every group
  // Group hyperparameters by the names of the algorithm's descriptor
  // (Algorithm::hyper: "lr", "beta1", ...; group_params.cpp). Throw
  // Error(DSOPT_EINVAL), changing nothing, on a bad group, name or value.
  double group_param(int32_t group, const std::string& name) const;
  void set_group_param(int32_t group, const std::string& name, double value);

  const AdamHyper& group(int32_t g) const { return groups_[size_t(g)]; }
  int64_t group_step(int32_t g) const { return steps_[size_t(g)]; }
  // Updates applied to parameter i (i in range).
  int64_t param_step(int64_t i) const { return param_steps_[size_t(i)]; }
  void set_param_step(int64_t i, int64_t step) { param_steps_[size_t(i)] = step; }

  // Counts one applied step: every group's, and every parameter's but those
  // `inactive` marks (empty: none).
  void advance(const std::vector<uint8_t>& inactive);

  // Every group's hyperparameters and step counter, and each parameter's
  // group and update count, in order (the algorithms' per-step constants
  // are formed from them).
  const std::vector<AdamHyper>& all_groups() const { return groups_; }
  const std::vector<int32_t>& param_groups() const { return param_groups_; }

  // The blob's common sections of the groups (optim/common_state.hpp):
  // the group step counters, learning rates, parameter step counters and
  // the other hyperparameters (common.hyper: write_hyper and read_hyper).
  std::vector<int64_t>& steps() { return steps_; }
  std::vector<int64_t>& param_steps() { return param_steps_; }
  const std::vector<int64_t>& steps() const { return steps_; }
  const std::vector<int64_t>& param_steps() const { return param_steps_; }
  // Every group's lr, in group order.
  void write_lrs(FieldWriter& f) const;
  void read_lrs(FieldReader& f);
  // Per group, the algorithm's hyperparameters but lr, as
  // optim/hyper_section.hpp lays them out. hyper_bytes: the section's length
  // (blob nullptr: the live one; of blob r: the layout r holds);
  // check_hyper throws Error(DSOPT_ECORRUPT), changing nothing, on a value
  // out of range; read_hyper restores the checked values. check_hyper_size
  // throws Error(DSOPT_ECORRUPT) when blob r's section has a size of no
  // layout (after the group count is known to match).
  uint64_t hyper_bytes(const BlobReader* r) const;
  void check_hyper_size(const BlobReader& r) const;
  void write_hyper(FieldWriter& f) const;
  void check_hyper(FieldReader& f) const;
  void read_hyper(FieldReader& f);
  // Parameter steps of a blob saved before parameters counted their own:
  // their groups' steps.
  void param_steps_from_groups();

 private:
  const OptimizerConfig& config_;
  std::vector<AdamHyper> groups_;
  std::vector<int64_t> steps_;
  std::vector<int32_t> param_groups_;  // group of each parameter
  std::vector<int64_t> param_steps_;   // updates applied to each parameter
};

}  // namespace dsopt
