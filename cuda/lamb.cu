// launch_lamb_update and launch_max_per_tensor: the 1-bit LAMB rules and
// the per-tensor maximum, one multi-tensor launch sequence per dtype
// combination present.
#include <vector>

#include "base/error.hpp"
#include "lamb_update_kernel.cuh"
#include "launch.hpp"
#include "multi_tensor_apply.cuh"

namespace dsopt {
namespace cuda {
namespace {

using LambEntry = TensorListEntry<kLambDepth>;

int dtype_index(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 2; }

template <UpdateRule R, DType Param16, DType Grad>
void run(cudaStream_t stream, const std::vector<LambEntry>& list, const AdamConsts* consts,
         float mul1, float mul2) {
  if (list.empty()) return;
  const LambFunctor<R, Param16, Grad> f{consts, mul1, mul2};
  multi_tensor_apply<kLambDepth>(stream, kLambThreads, kLambChunk, list.data(),
                                 static_cast<int64_t>(list.size()), f);
}

template <UpdateRule R, DType Param16>
void run_grads(cudaStream_t stream, const std::vector<LambEntry> (&by_grad)[3],
               const AdamConsts* consts, float mul1, float mul2) {
  run<R, Param16, DType::F32>(stream, by_grad[0], consts, mul1, mul2);
  run<R, Param16, DType::F16>(stream, by_grad[1], consts, mul1, mul2);
  run<R, Param16, DType::BF16>(stream, by_grad[2], consts, mul1, mul2);
}

}  // namespace

void launch_lamb_update(cudaStream_t stream, UpdateRule rule, const AdamSlot* slots, int64_t count,
                        const AdamConsts* consts_dev, float mul1, float mul2) {
  const bool reads_grad = rule == UpdateRule::LambWarmup || rule == UpdateRule::LambMomentum;
  // lists[param16: none, f16, bf16][grad: f32, f16, bf16]
  std::vector<LambEntry> lists[3][3];
  for (int64_t i = 0; i < count; ++i) {
    const AdamSlot& s = slots[i];
    const bool writes_p16 = rule == UpdateRule::LambApply && s.param16 != nullptr;
    LambEntry e{};
    e.addr[kLMaster] = s.master;
    e.addr[kLParam16] = writes_p16 ? s.param16 : nullptr;
    e.addr[kLGrad] = reads_grad ? const_cast<void*>(s.grad) : nullptr;
    e.addr[kLExpAvg] = s.m;
    e.addr[kLExpAvgSq] = s.v;
    e.addr[kLFresh] = s.vf;
    e.addr[kLU] = s.u;
    e.addr[kLAux] = s.aux;
    e.addr[kLRatio] = s.ratio;
    e.addr[kLMask] = const_cast<float*>(s.mask);
    e.numel = s.numel;
    e.tag = s.group;
    lists[writes_p16 ? dtype_index(s.param16_dtype) : 0][reads_grad ? dtype_index(s.grad_dtype) : 0]
        .push_back(e);
  }
  switch (rule) {
    case UpdateRule::LambWarmup:
      return run_grads<UpdateRule::LambWarmup, DType::F32>(stream, lists[0], consts_dev, mul1, mul2);
    case UpdateRule::LambMomentum:
      return run_grads<UpdateRule::LambMomentum, DType::F32>(stream, lists[0], consts_dev, mul1, mul2);
    case UpdateRule::LambCompressed:
      return run<UpdateRule::LambCompressed, DType::F32, DType::F32>(stream, lists[0][0], consts_dev, 1.0f, 1.0f);
    case UpdateRule::LambApply:
      run<UpdateRule::LambApply, DType::F32, DType::F32>(stream, lists[0][0], consts_dev, 1.0f, 1.0f);
      run<UpdateRule::LambApply, DType::F16, DType::F32>(stream, lists[1][0], consts_dev, 1.0f, 1.0f);
      run<UpdateRule::LambApply, DType::BF16, DType::F32>(stream, lists[2][0], consts_dev, 1.0f, 1.0f);
      return;
    default:
      fail(DSOPT_EINTERNAL, "launch_lamb_update: not a 1-bit LAMB rule");
  }
}

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
