// SGD (docs/optimizers/sgd.md): torch.optim.SGD's keys, defaults and
// semantics (the rule of math/sgd.hpp with one fp32 moment, the momentum
// buffer), on every gradient path of the moment rules.
#include <string>
#include <vector>

#include "config/config_values.hpp"
#include "algorithms/registry.hpp"
#include "algorithms/moment_rules/moment_rule.hpp"
#include "math/sgd.hpp"
#include "optim/config.hpp"

namespace dsopt {
namespace {

template <int K>
double& extra(AdamHyper& h) {
  return h.extra[K];
}

Algorithm sgd() {
  Algorithm a = elementwise_algorithm("SGD", UpdateRule::Sgd, MomentNames("sgd", {"momentum_buffer"}));
  const std::vector<HyperParam> adam = adam_hyper_params({"lr", "weight_decay"});
  a.hyper = {
      adam[0],
      {"momentum", "momentum", 0.0, HyperRange::NonNegative, false, extra<kSgdMomentum>},
      {"dampening", "dampening", 0.0, HyperRange::NonNegative, false, extra<kSgdDampening>},
      adam[1],
      {"nesterov", "nesterov", 0.0, HyperRange::Flag, false, extra<kSgdNesterov>},
  };
  a.defaults.bias_correction = false;
  a.defaults.decoupled = false;  // weight decay is L2, added to the gradient
  a.step_consts = sgd_consts;
  a.check_group = [](const AdamHyper& h) -> std::string {
    if (h.extra[kSgdNesterov] != 0.0 && (h.extra[kSgdMomentum] <= 0.0 || h.extra[kSgdDampening] != 0.0))
      return "nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD)";
    return "";
  };
  return a;
}

}  // namespace

extern const Algorithm kSgdAlgorithm = sgd();

}  // namespace dsopt
