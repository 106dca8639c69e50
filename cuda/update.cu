// launch_update: slots grouped by what the rule's code depends on (16-bit
// parameter dtype and gradient dtype; some rules write no parameter or read
// no gradient, update_kernel.cuh), one multi-tensor launch sequence per
// combination present.
#include <vector>

#include "base/error.hpp"
#include "launch.hpp"
#include "multi_tensor_apply.cuh"
#include "update_kernel.cuh"

namespace dsopt {
namespace cuda {
namespace {

using UpdateEntry = TensorListEntry<kUpdateDepth>;

template <UpdateRule R, DType Param16, DType Grad>
void run(cudaStream_t stream, const std::vector<UpdateEntry>& list, const AdamConsts* consts,
         float mul1, float mul2) {
  if (list.empty()) return;
  const UpdateFunctor<R, Param16, Grad> f{consts, mul1, mul2};
  multi_tensor_apply<kUpdateDepth>(stream, kUpdateThreads, kUpdateChunk, list.data(),
                                   static_cast<int64_t>(list.size()), f);
}

int dtype_index(DType t) { return t == DType::F32 ? 0 : t == DType::F16 ? 1 : 2; }

// lists[param16: none, f16, bf16][grad: f32, f16, bf16]
using Lists = std::vector<UpdateEntry>[3][3];

template <UpdateRule R, DType Param16>
void run_grads(cudaStream_t stream, const Lists& lists, const AdamConsts* consts, float mul1,
               float mul2) {
  const int p = dtype_index(Param16);
  run<R, Param16, DType::F32>(stream, lists[p][0], consts, mul1, mul2);
  run<R, Param16, DType::F16>(stream, lists[p][1], consts, mul1, mul2);
  run<R, Param16, DType::BF16>(stream, lists[p][2], consts, mul1, mul2);
}

// Rules that read the gradient and write the parameter: every combination.
template <UpdateRule R>
void run_all(cudaStream_t stream, const Lists& lists, const AdamConsts* consts, float mul1,
             float mul2) {
  run_grads<R, DType::F32>(stream, lists, consts, mul1, mul2);
  run_grads<R, DType::F16>(stream, lists, consts, mul1, mul2);
  run_grads<R, DType::BF16>(stream, lists, consts, mul1, mul2);
}

// Rules that read no gradient but write the parameter: one list per 16-bit
// parameter dtype.
template <UpdateRule R>
void run_params(cudaStream_t stream, const Lists& lists, const AdamConsts* consts) {
  run<R, DType::F32, DType::F32>(stream, lists[0][0], consts, 1.0f, 1.0f);
  run<R, DType::F16, DType::F32>(stream, lists[1][0], consts, 1.0f, 1.0f);
  run<R, DType::BF16, DType::F32>(stream, lists[2][0], consts, 1.0f, 1.0f);
}

}  // namespace

void launch_update(cudaStream_t stream, UpdateRule rule, const AdamSlot* slots, int64_t count,
                   const AdamConsts* consts_dev, float mul1, float mul2) {
  if (rule == UpdateRule::LambWarmup || rule == UpdateRule::LambMomentum ||
      rule == UpdateRule::LambCompressed || rule == UpdateRule::LambApply)
    return launch_lamb_update(stream, rule, slots, count, consts_dev, mul1, mul2);
  const bool grad = reads_grad(rule);
  const bool param = writes_param(rule);
  Lists lists;
  for (int64_t i = 0; i < count; ++i) {
    const AdamSlot& s = slots[i];
    if (s.param16 != nullptr && s.param16_dtype == DType::F32)
      fail(DSOPT_EINTERNAL, "update: 16-bit parameter copy with dtype float32");
    const int p = param && s.param16 != nullptr ? dtype_index(s.param16_dtype) : 0;
    const int g = grad ? dtype_index(s.grad_dtype) : 0;
    UpdateEntry e;
    e.addr[kMaster] = s.master;
    e.addr[kParam16] = param ? s.param16 : nullptr;
    e.addr[kGrad] = grad ? const_cast<void*>(s.grad) : nullptr;
    e.addr[kExpAvg] = s.m;
    e.addr[kExpAvgSq] = s.v;
    e.addr[kMask] = reads_mask(rule) ? const_cast<float*>(s.mask) : nullptr;
    e.addr[kAcc] = s.acc;
    e.addr[kAnchor] = s.anchor;
    e.numel = s.numel;
    e.tag = s.group;
    lists[p][g].push_back(e);
  }
  switch (rule) {
    case UpdateRule::Adam:
      return run_all<UpdateRule::Adam>(stream, lists, consts_dev, mul1, mul2);
    case UpdateRule::OneBitWarmup:
      return run_all<UpdateRule::OneBitWarmup>(stream, lists, consts_dev, mul1, mul2);
    case UpdateRule::OneBitMomentum:  // one list per gradient dtype
      return run_grads<UpdateRule::OneBitMomentum, DType::F32>(stream, lists, consts_dev, mul1, mul2);
    case UpdateRule::OneBitApply:  // one list per 16-bit parameter dtype
      return run_params<UpdateRule::OneBitApply>(stream, lists, consts_dev);
    case UpdateRule::ZeroOneGradient:
      return run_all<UpdateRule::ZeroOneGradient>(stream, lists, consts_dev, mul1, mul2);
    case UpdateRule::ZeroOneLocal:
      return run_all<UpdateRule::ZeroOneLocal>(stream, lists, consts_dev, mul1, mul2);
    case UpdateRule::ZeroOneGradientPrepare:  // one list: no gradient, no parameter
      return run<UpdateRule::ZeroOneGradientPrepare, DType::F32, DType::F32>(stream, lists[0][0], consts_dev, 1.0f, 1.0f);
    case UpdateRule::ZeroOneSyncPrepare:
      return run<UpdateRule::ZeroOneSyncPrepare, DType::F32, DType::F32>(stream, lists[0][0], consts_dev, 1.0f, 1.0f);
    case UpdateRule::ZeroOneSyncApply:
      return run_params<UpdateRule::ZeroOneSyncApply>(stream, lists, consts_dev);
    default:
      break;
  }
  fail(DSOPT_EINTERNAL, "update: unknown rule");
}

}  // namespace cuda
}  // namespace dsopt
