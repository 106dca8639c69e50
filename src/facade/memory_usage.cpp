// dsopt_memory_usage and dsopt_state_memory_usage: the bytes of the buffers
// dsopt holds for an optimizer, and the part of them its state schema's
// arrays (masters included) take.
#include "facade/optimizer.hpp"
#include "facade/optimizer_impl.hpp"

namespace dsopt {

Optimizer::MemoryUsage Optimizer::memory_usage() const {
  const OptimizerParts& parts = impl_->parts;
  MemoryUsage m;
  (parts.config().cuda ? m.device : m.host) += parts.kernels().buffer_bytes();
  m.host += parts.host_kernels().buffer_bytes();
  return m;
}

Optimizer::MemoryUsage Optimizer::state_memory_usage() const {
  const StateSchema::Bytes b = impl_->state_schema().array_bytes();
  return MemoryUsage{b.host, b.device};
}

}  // namespace dsopt
