#include "optim/adam.hpp"

namespace dsopt {
namespace {
const char* kExpAvg = "adam.exp_avg";
const char* kExpAvgSq = "adam.exp_avg_sq";
}  // namespace

Adam::Adam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
           const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count), decoupled_(cfg.defaults.decoupled) {
  const size_t bytes = size_t(this->params().total_numel()) * 4;
  exp_avg_ = DeviceBuffer(this->kernels(), bytes);
  exp_avg_sq_ = DeviceBuffer(this->kernels(), bytes);
  this->kernels().fill_zero(exp_avg_.get(), bytes);
  this->kernels().fill_zero(exp_avg_sq_.get(), bytes);
}

std::string Adam::algorithm() const { return decoupled_ ? "AdamW" : "Adam"; }

void Adam::update(const PreparedGrads& grads) {
  std::vector<AdamConsts> consts;
  for (int32_t g = 0; g < num_groups(); ++g) consts.push_back(adam_consts(group(g), group_step(g)));
  std::vector<AdamSlot> slots;
  const auto& ps = params().params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const Param& p = ps[i];
    slots.push_back(AdamSlot{p.master, p.dtype == DType::F32 ? nullptr : p.data, p.dtype,
                             grads.grads[i].data, grads.grads[i].dtype,
                             exp_avg_.floats() + p.offset, exp_avg_sq_.floats() + p.offset,
                             p.numel, p.group});
  }
  kernels().adam_update(slots.data(), int64_t(slots.size()), consts.data(), num_groups(),
                        grads.mul1, grads.mul2);
}

void Adam::save_sections(BlobWriter& w) const {
  w.section_from_device(kExpAvg, exp_avg_.get(), exp_avg_.bytes(), kernels());
  w.section_from_device(kExpAvgSq, exp_avg_sq_.get(), exp_avg_sq_.bytes(), kernels());
}

void Adam::check_sections(const BlobReader& r) const {
  r.section(kExpAvg, exp_avg_.bytes());
  r.section(kExpAvgSq, exp_avg_sq_.bytes());
}

void Adam::restore_sections(const BlobReader& r) {
  kernels().copy_from_host(exp_avg_.get(), r.section(kExpAvg, exp_avg_.bytes()), exp_avg_.bytes());
  kernels().copy_from_host(exp_avg_sq_.get(), r.section(kExpAvgSq, exp_avg_sq_.bytes()),
                           exp_avg_sq_.bytes());
}

}  // namespace dsopt
