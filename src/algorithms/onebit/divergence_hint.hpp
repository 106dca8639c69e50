// What the message of a diverging 1-bit run suggests (dsopt_step_info
// .diverging, optim/divergence_check.hpp): with "stabilize" off, that
// DeepSpeed's rule is the likely cause; otherwise the knobs that tame it.
#pragma once
#include <string>

namespace dsopt {

// `diverging` names what diverges ("compression stage diverges where the
// frozen variance", "1-bit steps diverge where the variance"), `lr` the
// step-size knobs ("lr", "lr or max_coeff") and `freeze` the config key
// that ends the warmup.
inline std::string onebit_divergence_hint(bool stabilize, const std::string& diverging,
                                          const std::string& lr, const std::string& freeze) {
  if (!stabilize)
    return "\"stabilize\" is off: DeepSpeed's " + diverging + " is near zero; set \"stabilize\": "
           "true (the default), or a lower " + lr + " or later " + freeze;
  return "try a lower " + lr + ", \"gradient_clipping\" or a later " + freeze;
}

}  // namespace dsopt
