#include "algorithms/moment_rules/adam_step_consts.hpp"

#include <map>
#include <utility>

namespace dsopt {

AdamStepConsts adam_step_consts(const std::vector<AdamHyper>& groups,
                                const std::vector<int64_t>& group_steps,
                                const std::vector<int32_t>& param_groups,
                                const std::vector<int64_t>& param_steps,
                                const std::vector<uint8_t>& inactive, StepConstsFn consts) {
  if (!consts) consts = adam_consts;
  AdamStepConsts out;
  bool by_group = inactive.empty();
  for (size_t i = 0; by_group && i < param_steps.size(); ++i)
    by_group = param_steps[i] == group_steps[size_t(param_groups[i])];
  if (by_group) {
    for (size_t g = 0; g < groups.size(); ++g)
      out.consts.push_back(consts(groups[g], group_steps[g]));
    return out;
  }
  std::map<std::pair<int32_t, int64_t>, int32_t> index;
  out.of_param.assign(param_steps.size(), -1);
  for (size_t i = 0; i < param_steps.size(); ++i) {
    if (!inactive.empty() && inactive[i]) continue;
    const std::pair<int32_t, int64_t> key{param_groups[i], param_steps[i]};
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, int32_t(out.consts.size())).first;
      out.consts.push_back(consts(groups[size_t(key.first)], key.second));
    }
    out.of_param[i] = it->second;
  }
  return out;
}

}  // namespace dsopt
