// dsopt_memory_usage and dsopt_state_memory_usage: the bytes of the buffers
// dsopt holds for an optimizer, and the part of them its state schema's
// arrays (masters included) take.
#include "optim/optimizer.hpp"

namespace dsopt {

Optimizer::MemoryUsage Optimizer::memory_usage() const {
  MemoryUsage m;
  (cfg_.cuda ? m.device : m.host) += kernels_->buffer_bytes();
  m.host += host_->buffer_bytes();
  return m;
}

Optimizer::MemoryUsage Optimizer::state_memory_usage() const {
  const StateSchema::Bytes b = state_schema().array_bytes();
  return MemoryUsage{b.host, b.device};
}

}  // namespace dsopt
