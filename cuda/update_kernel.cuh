// The Adam-family update functor for the multi-tensor kernel, templated on
// the rule (Kernels::update): every element runs the same function of
// math/adam.hpp or math/onebit_adam.hpp with ScalarOps that the CPU kernels
// run (src/kernels/cpu/cpu_loops.hpp, rule_at), and loads and stores what
// rule_at does, so both give the same bits:
//   Adam, OneBitWarmup  read g, p, m, v; write m, v, p (and the 16-bit copy)
//   OneBitMomentum      reads g, m (and v in the update's units); writes m
//   OneBitApply         reads p, m, v (and the mask); writes m (when masked
//                       or in the update's units), p and the 16-bit copy;
//                       reads no gradient
//   ZeroOneGradientPrepare  reads v, acc; writes acc
//   ZeroOneGradient     reads g, mask, p, m, v; writes m, p
//   ZeroOneLocal        reads g, p, m, v, acc; writes m, acc, p
//   ZeroOneSyncPrepare  reads v, acc; writes acc
//   ZeroOneSyncApply    reads acc, mask, anchor, v; writes m, p, anchor, acc
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "kernels/kernels.hpp"
#include "math/adam.hpp"
#include "math/onebit_adam.hpp"
#include "math/scalar_ops.hpp"
#include "math/zero_one_adam.hpp"

namespace dsopt {
namespace cuda {

// Addresses of one tensor in the tensor list.
enum UpdateAddr { kMaster, kParam16, kGrad, kExpAvg, kExpAvgSq, kMask, kAcc, kAnchor, kUpdateDepth };

constexpr int kUpdateChunk = 65536;  // elements per block (docs/design/adam.md 2.6)
constexpr int kUpdateThreads = 512;
constexpr int kUpdateIlp = 4;  // elements in flight per thread

// `Param16` is the dtype of the 16-bit parameter copy, or F32 for none;
// `Grad` the gradient's dtype (ignored by OneBitApply).
constexpr bool reads_grad(UpdateRule r) {
  return r != UpdateRule::OneBitApply && r != UpdateRule::ZeroOneGradientPrepare &&
         r != UpdateRule::ZeroOneSyncPrepare && r != UpdateRule::ZeroOneSyncApply;
}
constexpr bool prepares_car(UpdateRule r) {
  return r == UpdateRule::ZeroOneGradientPrepare || r == UpdateRule::ZeroOneSyncPrepare;
}
constexpr bool writes_param(UpdateRule r) {
  return r != UpdateRule::OneBitMomentum && !prepares_car(r);
}
constexpr bool reads_mask(UpdateRule r) {
  return r == UpdateRule::OneBitApply || r == UpdateRule::ZeroOneGradient ||
         r == UpdateRule::ZeroOneSyncApply;
}

// One element of rule R, as rule_at does it on the CPU.
template <UpdateRule R>
__device__ __forceinline__ void update_element(float& p, float& m, float& v, float g, float mk,
                                               float& acc, float& anchor, bool masked,
                                               const AdamConsts& c) {
  if constexpr (R == UpdateRule::OneBitApply) {
    if (c.update_units) m = onebit_from_update_units<ScalarOps>(m, v, c);
    if (masked) m = ScalarOps::mul(m, mk);
    onebit_apply<ScalarOps>(p, m, v, c);
  } else if constexpr (R == UpdateRule::OneBitMomentum) {
    onebit_momentum<ScalarOps>(m, g, c);
    if (c.update_units) m = onebit_to_update_units<ScalarOps>(m, v, c);
  } else if constexpr (R == UpdateRule::ZeroOneGradientPrepare) {
    acc = onebit_to_update_units<ScalarOps>(acc, v, c);
  } else if constexpr (R == UpdateRule::ZeroOneGradient) {
    if (c.update_units) g = onebit_from_update_units<ScalarOps>(g, v, c);
    if (masked) g = ScalarOps::mul(g, mk);
    zoadam_gradient<ScalarOps>(p, m, v, g, c);
  } else if constexpr (R == UpdateRule::ZeroOneLocal) {
    zoadam_local<ScalarOps>(p, m, v, acc, g, c);
  } else if constexpr (R == UpdateRule::ZeroOneSyncPrepare) {
    zoadam_sync_prepare<ScalarOps>(acc, v, c);
  } else if constexpr (R == UpdateRule::ZeroOneSyncApply) {
    if (c.update_units) acc = onebit_from_update_units<ScalarOps>(acc, v, c);
    if (masked) acc = ScalarOps::mul(acc, mk);
    zoadam_sync_apply<ScalarOps>(p, m, v, acc, anchor, c);
    anchor = p;
    acc = 0.0f;
  } else if constexpr (R == UpdateRule::Adam) {
    adam_update<ScalarOps>(p, m, v, g, c);
  } else {
    onebit_warmup<ScalarOps>(p, m, v, g, c);
  }
}

// `Param16` is the dtype of the 16-bit parameter copy, or F32 for none;
// `Grad` the gradient's dtype (ignored by rules that read none).
template <UpdateRule R, DType Param16, DType Grad>
struct UpdateFunctor {
  static constexpr bool kReadsGrad = reads_grad(R);
  static constexpr bool kWritesParam = writes_param(R);
  static constexpr bool kReadsMask = reads_mask(R);
  static constexpr bool kReadsParam = kWritesParam && R != UpdateRule::ZeroOneSyncApply;
  static constexpr bool kUsesM = !prepares_car(R);
  static constexpr bool kReadsM = kUsesM && R != UpdateRule::ZeroOneSyncApply;
  static constexpr bool kWritesM = kUsesM && !(R == UpdateRule::OneBitApply);
  static constexpr bool kWritesV = R == UpdateRule::Adam || R == UpdateRule::OneBitWarmup;
  // OneBitMomentum reads v only in the update's units (c.update_units).
  static constexpr bool kReadsV = R != UpdateRule::OneBitMomentum;
  static constexpr bool kUsesAcc = R == UpdateRule::ZeroOneLocal || prepares_car(R) ||
                                   R == UpdateRule::ZeroOneSyncApply;
  static constexpr bool kUsesAnchor = R == UpdateRule::ZeroOneSyncApply;

  const AdamConsts* consts;  // device memory, indexed by the tensor's tag (group)
  float mul1, mul2;

  __device__ __forceinline__ void operator()(const TensorListMeta<kUpdateDepth>& meta, int t,
                                             int64_t chunk, int64_t chunk_size) const {
    float* __restrict__ master = static_cast<float*>(meta.addr[kMaster][t]);
    void* param16 = meta.addr[kParam16][t];
    const void* grad = meta.addr[kGrad][t];
    float* __restrict__ m = static_cast<float*>(meta.addr[kExpAvg][t]);
    float* __restrict__ v = static_cast<float*>(meta.addr[kExpAvgSq][t]);
    const float* __restrict__ mask = static_cast<const float*>(meta.addr[kMask][t]);
    float* __restrict__ acc = static_cast<float*>(meta.addr[kAcc][t]);
    float* __restrict__ anchor = static_cast<float*>(meta.addr[kAnchor][t]);
    const bool masked = kReadsMask && mask != nullptr;
    const AdamConsts c = consts[meta.tag[t]];
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    const int64_t stride = int64_t(blockDim.x) * kUpdateIlp;

    for (int64_t base = begin + threadIdx.x; base < end; base += stride) {
      float p[kUpdateIlp], mm[kUpdateIlp], vv[kUpdateIlp], g[kUpdateIlp], mk[kUpdateIlp];
      float aa[kUpdateIlp], an[kUpdateIlp];
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        p[k] = mm[k] = vv[k] = g[k] = aa[k] = an[k] = 0.0f;
        mk[k] = 1.0f;
        if (i < end) {
          if constexpr (kReadsGrad) g[k] = load_float<Grad>(grad, i);
          if constexpr (kReadsParam) p[k] = master[i];
          if constexpr (kReadsM) mm[k] = m[i];
          if (kReadsV || (R == UpdateRule::OneBitMomentum && c.update_units)) vv[k] = v[i];
          if constexpr (kReadsMask) mk[k] = masked ? mask[i] : 1.0f;
          if constexpr (kUsesAcc) aa[k] = acc[i];
          if constexpr (kUsesAnchor) an[k] = anchor[i];
        }
      }
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i >= end) continue;
        float gk = 0.0f;
        if constexpr (kReadsGrad) gk = ScalarOps::mul(ScalarOps::mul(g[k], mul1), mul2);
        update_element<R>(p[k], mm[k], vv[k], gk, mk[k], aa[k], an[k], masked, c);
        if constexpr (kWritesM) m[i] = mm[k];
        if constexpr (R == UpdateRule::OneBitApply) {
          if (masked || c.update_units) m[i] = mm[k];
        }
        if constexpr (kWritesV) v[i] = vv[k];
        if constexpr (kUsesAcc) acc[i] = aa[k];
        if constexpr (kUsesAnchor) anchor[i] = an[k];
        if constexpr (kWritesParam) {
          master[i] = p[k];
          if constexpr (Param16 != DType::F32) store_float<Param16>(param16, i, p[k]);
        }
      }
    }
  }
};

}  // namespace cuda
}  // namespace dsopt
