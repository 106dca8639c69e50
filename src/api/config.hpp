// JSON config text -> OptimizerConfig, with every key and value checked.
#pragma once
#include <string>

#include "optim/config.hpp"

namespace dsopt {

// Throws Error(DSOPT_EINVAL) naming the offending key by its path, or
// Error(DSOPT_EUNSUPPORTED) for what this build or version cannot do.
OptimizerConfig parse_config(const char* json_text);

}  // namespace dsopt
