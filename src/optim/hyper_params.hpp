// An algorithm's group hyperparameters as its descriptor lists them
// (Algorithm::hyper): the name dsopt_get/set_group_param take, the config
// key of optimizer.params and param_groups[i], the default, the values
// accepted and the field of AdamHyper that holds the value. The config
// reader and writer, the group getters and setters and the blob's hyper
// section all follow the list; nothing outside the math layer names the
// fields one by one.
#pragma once
#include <string>
#include <vector>

#include "math/adam.hpp"

namespace dsopt {

// The values a hyperparameter accepts.
enum class HyperRange {
  Beta,         // in [0, 1), and below 1 in fp32 (the update's precision)
  NonNegative,  // finite and >= 0
  Flag,         // 0 or 1: true or false in a config (SGD's nesterov)
};

struct HyperParam {
  std::string name;  // dsopt_get/set_group_param's name ("beta1")
  std::string key;   // its config key ("betas"); a key of several names is a list of them, in order
  double dflt;       // default of optimizer.params
  HyperRange range;
  // The config asks more than a set value does: > 0 and nonzero in fp32
  // (eps: a config's 0 is a typo; dsopt_set_group_param takes 0).
  bool positive_in_config = false;
  // Where the value lives in a group's AdamHyper (a field the algorithm's
  // rule reads, or one of AdamHyper::extra for a value Adam lacks).
  double& (*value)(AdamHyper& h) = nullptr;

  double get(const AdamHyper& h) const { return value(const_cast<AdamHyper&>(h)); }
  void set(AdamHyper& h, double v) const { value(h) = v; }
};

// The learning rate, every algorithm's first hyperparameter: it lives in
// the blob's common.lr, the others in common.hyper (optim/hyper_section.hpp).
constexpr const char* kLrName = "lr";

// Adam's hyperparameters, lr, beta1, beta2 (key "betas"), eps and
// weight_decay, with Adam's defaults; `names`: those of them, in that order.
std::vector<HyperParam> adam_hyper_params();
std::vector<HyperParam> adam_hyper_params(const std::vector<std::string>& names);

// The hyperparameter `name` of `params`, nullptr when none is.
const HyperParam* find_hyper(const std::vector<HyperParam>& params, const std::string& name);
// The config keys of `params`, each once, in order.
std::vector<std::string> hyper_keys(const std::vector<HyperParam>& params);
// The names of `params` as "\"lr\", \"beta1\", ...".
std::string hyper_names(const std::vector<HyperParam>& params);
// The names of `params` and their config keys, each space-separated
// (dsopt_group_param_names); `params` a descriptor's list, whose strings
// are kept for the program's life.
struct HyperNames {
  std::string names, keys;
};
const HyperNames& hyper_name_lists(const std::vector<HyperParam>& params);
// Every hyperparameter of `params` set to its default in `h`.
void set_hyper_defaults(const std::vector<HyperParam>& params, AdamHyper& h);
// Why `v` is not a value `p` takes once configured ("must be in [0, 1), got
// 1.5"); empty when it is.
std::string hyper_value_error(const HyperParam& p, double v);
// The shortest text that reads back as `v` (1e-08 stays 1e-08, and
// 1.0000001 does not print as 1).
std::string show_number(double v);

}  // namespace dsopt
