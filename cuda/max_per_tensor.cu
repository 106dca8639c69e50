// launch_max_per_tensor: one multi-tensor launch sequence over the
// tensors.
#include <vector>

#include "launch.hpp"
#include "max_kernel.cuh"
#include "multi_tensor_apply.cuh"

namespace dsopt {
namespace cuda {

void launch_max_per_tensor(cudaStream_t stream, const TensorRef* src, int64_t count,
                           unsigned* out_dev) {
  std::vector<TensorListEntry<1>> list;
  for (int64_t i = 0; i < count; ++i) {
    TensorListEntry<1> e{};
    e.addr[0] = const_cast<void*>(src[i].data);
    e.numel = src[i].numel;
    e.tag = int32_t(i);
    list.push_back(e);
  }
  if (list.empty()) return;
  multi_tensor_apply<1>(stream, 256, 65536, list.data(), int64_t(list.size()), MaxFunctor{out_dev});
}

}  // namespace cuda
}  // namespace dsopt
