#include "optim/optimizer_parts.hpp"

#include <utility>

namespace dsopt {

OptimizerParts::OptimizerParts(const OptimizerConfig& cfg, Comm& comm,
                               std::unique_ptr<Kernels> kernels, const dsopt_tensor* params,
                               int64_t count, std::function<std::string()> blob_name,
                               std::function<void(StateSchema&)> describe,
                               std::function<void(int, const std::string&)> mark_failed)
    : cfg_(cfg),
      comm_(comm),
      kernels_(std::move(kernels)),
      host_(make_cpu_kernels(cfg.threads)),
      params_(params, count, int32_t(cfg.groups.size()), *kernels_, cfg.zero.stage == 0),
      agreement_(comm, Mem::host()),
      pipeline_(cfg.pipeline, comm, *kernels_, Mem{kernels_.get(), cfg.cuda_aware}, params_,
                runner_, agreement_, cfg.zero.reduce_bucket_size),
      groups_(cfg_, params_),
      absent_(*kernels_, params_),
      divergence_(cfg.pipeline.divergence),
      io_(comm, params_, *kernels_, CommonState{groups_, pipeline_.scaler(), run_id_, divergence_},
          std::move(blob_name), std::move(describe)),
      gathers_(cfg.zero.deferred_allgather, comm, runner_, *kernels_, std::move(mark_failed)) {}

StateSchema::Slicer OptimizerParts::flat_slices() const {
  return [this](int64_t i, float* array) {
    const Param& p = params_.params()[size_t(i)];
    return StateSchema::Slice{true, array + p.offset, p.numel, 0};
  };
}

void OptimizerParts::restore_masters(const float* host) {
  kernels_->copy_from_host(params_.masters(), host, uint64_t(params_.master_numel()) * 4);
  params_.write_back();
}

}  // namespace dsopt
