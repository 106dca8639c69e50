// dsopt_create's collective part: every rank builds its optimizer, then the
// ranks compare what they built and where they run.
#pragma once
#include <functional>
#include <memory>

#include "comm/comm.hpp"
#include "optim/config.hpp"
#include "facade/optimizer.hpp"

namespace dsopt {

// Collective. Parses the config with `parse` and builds the optimizer; then
// one allgather tells every rank whether each rank built one, with what
// config and parameter shapes, and on which machine and cores. A rank that
// failed throws its own error, every other rank DSOPT_EMISMATCH naming it;
// ranks that differ in config or shapes all throw DSOPT_EMISMATCH. On
// success the optimizer carries the run's id (rank 0's) and the default
// thread count for the ranks sharing its cores.
std::unique_ptr<Optimizer> create_optimizer(Comm& comm,
                                            const std::function<OptimizerConfig()>& parse,
                                            const dsopt_tensor* params, int64_t count);

}  // namespace dsopt
