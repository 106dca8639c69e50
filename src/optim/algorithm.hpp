// What an algorithm is to the library: one descriptor, registered once in
// src/algorithms. The config reader, the config writer, the factory and
// the moment rules look the algorithm up by its descriptor and never by
// its name. Its implementation is an AlgorithmImpl (optim/algorithm_impl.hpp).
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/kernels.hpp"
#include "math/adam.hpp"
#include "optim/hyper_params.hpp"
#include "state/section_names.hpp"

namespace dsopt {

class AlgorithmImpl;
class OptimizerParts;
struct OptimizerConfig;

// What an algorithm's config holds beyond the hyperparameters (its
// optimizer.params keys), defined in its family's folder.
struct AlgorithmSettings {
  virtual ~AlgorithmSettings() = default;
};

// The update rules that keep fp32 moments and nothing else between steps
// (algorithms/moment_rules/moment_rule.hpp): elementwise (Algorithm::update, with Adam's
// constants) or LAMB's per-tensor trust ratio; None: the algorithm has its
// own optimizer class.
enum class MomentRule { None, Elementwise, Lamb };

struct Algorithm {
  std::string type;                  // canonical "optimizer.type", also the blob's algorithm
  std::vector<std::string> aliases;  // other accepted spellings (any case, as the type)
  // Its hyperparameters, per group (optim/hyper_params.hpp): names, config
  // keys of optimizer.params and param_groups[i], defaults, accepted values
  // and where each lives; lr first. The blob's hyper section holds them.
  std::vector<HyperParam> hyper = adam_hyper_params();
  // The rule's settings beyond the hyperparameters (bias_correction,
  // decoupled); `hyper` sets the rest.
  AdamHyper defaults;
  // optimizer.params: the keys accepted beyond the hyperparameters.
  std::vector<std::string> keys;
  // param_groups[i]: the keys accepted beyond the hyperparameters.
  std::vector<std::string> group_keys;
  MomentRule rule = MomentRule::None;
  UpdateRule update = UpdateRule::Adam;  // an elementwise rule's update (math/update_rules.hpp)
  // An elementwise rule's constants of one group at its step t >= 1 (the
  // rule reads them as AdamConsts); nullptr: Adam's, adam_consts.
  AdamConsts (*step_consts)(const AdamHyper& h, long long t) = nullptr;
  // What the values of one group's hyperparameters must satisfy together
  // beyond each one's range ("" when they do; else why not, e.g. SGD's
  // "nesterov needs momentum > 0 and dampening 0"); nullptr: nothing.
  std::string (*check_group)(const AdamHyper& h) = nullptr;
  // The fp32 moments per element it keeps: their state view names and
  // blob sections (none: a moment rule must name them).
  MomentNames moments{"", {}};
  // The algorithm's name in blobs (nullptr: its type).
  std::string (*blob_name)(const OptimizerConfig& cfg) = nullptr;
  bool sharded = false;         // runs under ZeRO stage 1/2 (and compressed ZeRO)
  bool offload = false;         // its ZeRO shard can live in host memory (CUDA)
  bool compresses = false;      // 1-bit compressed communication after a warmup (momentum masks)

  // Parameters count their own steps (torch.optim's state["step"]): a
  // gradient absent on every rank leaves its parameter alone, and the
  // state of each parameter stands on its own, so it can be carried over
  // into an optimizer with more parameter groups.
  bool param_steps() const { return rule == MomentRule::Elementwise; }
  // Reads optimizer.params (keys already checked) into cfg.defaults and the
  // algorithm's settings; throws Error(DSOPT_EINVAL) naming the key
  // (nullptr: the algorithm has no keys beyond its hyperparameters).
  void (*read_params)(const nlohmann::json& params, const std::string& path,
                      OptimizerConfig& cfg) = nullptr;
  // The algorithm's own keys of optimizer.params as applied (the
  // hyperparameters are written by the caller; nullptr: none).
  void (*write_params)(const OptimizerConfig& cfg, nlohmann::json& params) = nullptr;
  // Builds the algorithm on an optimizer's parts (optim/algorithm_impl.hpp;
  // a moment rule's: make_moment_rule, by gradient path).
  std::unique_ptr<AlgorithmImpl> (*make)(OptimizerParts& parts) = nullptr;
};

}  // namespace dsopt
