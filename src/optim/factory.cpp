#include "optim/factory.hpp"

#include <string>

#include "base/error.hpp"
#include "optim/replicated_optimizer.hpp"
#include "optim/zero_optimizer.hpp"

namespace dsopt {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, Comm& comm,
                                          const dsopt_tensor* params, int64_t count) {
  if (!cfg.cuda && std::string(comm.backend()) == "nccl")
    fail(DSOPT_EUNSUPPORTED, "an NCCL communicator works on device memory: set \"device\": \"cuda\"");
  std::unique_ptr<Kernels> kernels =
      cfg.cuda ? make_cuda_kernels(comm.cuda_stream()) : make_cpu_kernels(cfg.threads);
  if (has_moment_rule(cfg) && cfg.zero.stage > 0)
    return std::make_unique<ZeroOptimizer>(cfg, comm, std::move(kernels), params, count);
  if (has_moment_rule(cfg))
    return std::make_unique<ReplicatedOptimizer>(cfg, comm, std::move(kernels), params, count);
  if (cfg.algorithm && cfg.algorithm->make)
    return cfg.algorithm->make(cfg, comm, std::move(kernels), params, count);
  fail(DSOPT_EINTERNAL, "no implementation for optimizer type " + cfg.type);
}

}  // namespace dsopt
