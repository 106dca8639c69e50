// Builds the optimizer a config names, on the device it names.
#pragma once
#include <memory>

#include "optim/optimizer.hpp"

namespace dsopt {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, Comm& comm,
                                          const dsopt_tensor* params, int64_t count);

}  // namespace dsopt
