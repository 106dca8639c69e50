// Adam and AdamW (docs/design/adam.md, decisions.md A1/A2): fp32 moments,
// one step counter per group, the update of math/adam.hpp on every device.
#pragma once
#include "optim/moments.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
       const dsopt_tensor* params, int64_t count);

 protected:
  std::string algorithm() const override;
  bool update(const PreparedGrads& grads) override;
  bool skips_absent() const override { return true; }
  void describe_state(StateSchema& s) override;
  std::function<void()> reshard(const Blobs& blobs) override;

 private:
  bool decoupled_;
  Moments moments_;
};

}  // namespace dsopt
