#include "optim/factory.hpp"

#include <string>

#include "base/error.hpp"

namespace dsopt {

std::unique_ptr<Kernels> make_kernels(const OptimizerConfig& cfg, Comm& comm) {
  if (!cfg.cuda && std::string(comm.backend()) == "nccl")
    fail(DSOPT_EUNSUPPORTED, "an NCCL communicator works on device memory: set \"device\": \"cuda\"");
  return cfg.cuda ? make_cuda_kernels(comm.cuda_stream()) : make_cpu_kernels(cfg.threads);
}

std::unique_ptr<AlgorithmImpl> make_algorithm(OptimizerParts& parts) {
  const OptimizerConfig& cfg = parts.config();
  if (cfg.algorithm && cfg.algorithm->make) return cfg.algorithm->make(parts);
  fail(DSOPT_EINTERNAL, "no implementation for optimizer type " + cfg.type);
}

}  // namespace dsopt
