#include "optim/adam.hpp"

namespace dsopt {

Adam::Adam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
           const dsopt_tensor* params, int64_t count)
    : Optimizer(cfg, comm, std::move(kernels), params, count),
      decoupled_(cfg.defaults.decoupled),
      moments_(this->params(), this->kernels(), "adam") {}

std::string Adam::algorithm() const { return decoupled_ ? "AdamW" : "Adam"; }

bool Adam::update(const PreparedGrads& grads) {
  std::vector<AdamConsts> consts;
  for (int32_t g = 0; g < num_groups(); ++g) consts.push_back(adam_consts(group(g), group_step(g)));
  const std::vector<AdamSlot> slots = moments_.slots(params(), &grads);
  kernels().update(UpdateRule::Adam, slots.data(), int64_t(slots.size()), consts.data(),
                   num_groups(), grads.mul1, grads.mul2);
  return false;
}

}  // namespace dsopt
