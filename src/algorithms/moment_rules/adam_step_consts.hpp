// The constants of one Adam/AdamW update when parameters may count their
// own steps (torch.optim's per-parameter state["step"]) and some are not
// updated at all (a gradient absent on every rank; see dsopt_step).
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/kernels.hpp"
#include "math/adam.hpp"

namespace dsopt {

struct AdamStepConsts {
  std::vector<AdamConsts> consts;
  // Empty: every parameter is updated with its group's constants (consts[g]),
  // the usual case. Else for parameter i the index of its constants in
  // `consts`, or -1 when it is not updated this step.
  std::vector<int32_t> of_param;

  // The constants index of parameter i with group g (-1: not updated).
  int32_t index(int64_t i, int32_t g) const { return of_param.empty() ? g : of_param[size_t(i)]; }

  // `slots` with UpdateSlot::group set to their constants, those of
  // parameters not updated left out; param_of(k) is slot k's parameter.
  template <class ParamOf>
  std::vector<UpdateSlot> select(const std::vector<UpdateSlot>& slots, ParamOf param_of) const {
    std::vector<UpdateSlot> out;
    out.reserve(slots.size());
    for (size_t k = 0; k < slots.size(); ++k) {
      const int32_t c = index(param_of(k), slots[k].group);
      if (c < 0) continue;
      out.push_back(slots[k]);
      out.back().group = c;
    }
    return out;
  }
};

// The constants of a group at step t (adam_consts, or an elementwise
// rule's own: Algorithm::step_consts).
using StepConstsFn = AdamConsts (*)(const AdamHyper& h, long long t);

// One AdamConsts per group when every parameter's step equals its group's
// step and none is left out; else one per distinct (group, step).
// `inactive` is empty or has 1 for each parameter not updated; `consts`
// forms them (nullptr: adam_consts).
AdamStepConsts adam_step_consts(const std::vector<AdamHyper>& groups,
                                const std::vector<int64_t>& group_steps,
                                const std::vector<int32_t>& param_groups,
                                const std::vector<int64_t>& param_steps,
                                const std::vector<uint8_t>& inactive,
                                StepConstsFn consts = nullptr);

}  // namespace dsopt
