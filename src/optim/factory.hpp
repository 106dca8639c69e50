// Builds what a config names: the kernels of its device, and on an
// optimizer's parts its algorithm (its descriptor's Algorithm::make).
#pragma once
#include <memory>

#include "comm/comm.hpp"
#include "kernels/kernels.hpp"
#include "optim/algorithm_impl.hpp"
#include "optim/config.hpp"
#include "optim/optimizer_parts.hpp"

namespace dsopt {

// Throws Error(DSOPT_EUNSUPPORTED) for an NCCL communicator on the CPU.
std::unique_ptr<Kernels> make_kernels(const OptimizerConfig& cfg, Comm& comm);
std::unique_ptr<AlgorithmImpl> make_algorithm(OptimizerParts& parts);

}  // namespace dsopt
