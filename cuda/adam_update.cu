// launch_adam: slots grouped by (16-bit parameter dtype, gradient dtype),
// one multi-tensor launch sequence per combination present.
#include <string>
#include <vector>

#include "base/error.hpp"
#include "adam_kernel.cuh"
#include "launch.hpp"
#include "multi_tensor_apply.cuh"

namespace dsopt {
namespace cuda {
namespace {

using AdamEntry = TensorListEntry<kAdamDepth>;

template <DType Param16, DType Grad>
void run(cudaStream_t stream, const std::vector<AdamEntry>& list, const AdamConsts* consts,
         float mul1, float mul2) {
  if (list.empty()) return;
  const AdamFunctor<Param16, Grad> f{consts, mul1, mul2};
  multi_tensor_apply<kAdamDepth>(stream, kAdamThreads, kAdamChunk, list.data(),
                                 static_cast<int64_t>(list.size()), f);
}

template <DType Param16>
void run_grads(cudaStream_t stream, const std::vector<AdamEntry>* by_grad,
               const AdamConsts* consts, float mul1, float mul2) {
  run<Param16, DType::F32>(stream, by_grad[0], consts, mul1, mul2);
  run<Param16, DType::F16>(stream, by_grad[1], consts, mul1, mul2);
  run<Param16, DType::BF16>(stream, by_grad[2], consts, mul1, mul2);
}

int dtype_index(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 2; }

}  // namespace

void launch_adam(cudaStream_t stream, const AdamSlot* slots, int64_t count,
                 const AdamConsts* consts_dev, float mul1, float mul2) {
  // [param16: none, f16, bf16][grad: f32, f16, bf16]
  std::vector<AdamEntry> lists[3][3];
  for (int64_t i = 0; i < count; ++i) {
    const AdamSlot& s = slots[i];
    if (s.param16 != nullptr && s.param16_dtype == DType::F32)
      fail(DSOPT_EINTERNAL, "adam_update: 16-bit parameter copy with dtype float32");
    const int p = s.param16 == nullptr ? 0 : dtype_index(s.param16_dtype);
    AdamEntry e;
    e.addr[kMaster] = s.master;
    e.addr[kParam16] = s.param16;
    e.addr[kGrad] = const_cast<void*>(s.grad);
    e.addr[kExpAvg] = s.m;
    e.addr[kExpAvgSq] = s.v;
    e.numel = s.numel;
    e.tag = s.group;
    lists[p][dtype_index(s.grad_dtype)].push_back(e);
  }
  run_grads<DType::F32>(stream, lists[0], consts_dev, mul1, mul2);
  run_grads<DType::F16>(stream, lists[1], consts_dev, mul1, mul2);
  run_grads<DType::BF16>(stream, lists[2], consts_dev, mul1, mul2);
}

}  // namespace cuda
}  // namespace dsopt
