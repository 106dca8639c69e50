// The Adam-family update functor for the multi-tensor kernel, templated on
// the rule (Kernels::update): every element runs the same function of
// math/adam.hpp or math/onebit_adam.hpp with ScalarOps that the CPU kernels
// run (src/kernels/cpu/cpu_loops.hpp, rule_at), and loads and stores what
// rule_at does, so both give the same bits:
//   Adam, OneBitWarmup  read g, p, m, v; write m, v, p (and the 16-bit copy)
//   OneBitMomentum      reads g, m; writes m
//   OneBitApply         reads p, m, v (and the mask); writes m (when masked),
//                       p and the 16-bit copy; reads no gradient
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "kernels/kernels.hpp"
#include "math/adam.hpp"
#include "math/onebit_adam.hpp"
#include "math/scalar_ops.hpp"

namespace dsopt {
namespace cuda {

// Addresses of one tensor in the tensor list.
enum UpdateAddr { kMaster, kParam16, kGrad, kExpAvg, kExpAvgSq, kMask, kUpdateDepth };

constexpr int kUpdateChunk = 65536;  // elements per block (spec adam.md 2.6)
constexpr int kUpdateThreads = 512;
constexpr int kUpdateIlp = 4;  // elements in flight per thread

// `Param16` is the dtype of the 16-bit parameter copy, or F32 for none;
// `Grad` the gradient's dtype (ignored by OneBitApply).
template <UpdateRule R, DType Param16, DType Grad>
struct UpdateFunctor {
  static constexpr bool kReadsGrad = R != UpdateRule::OneBitApply;
  static constexpr bool kUsesParam = R != UpdateRule::OneBitMomentum;  // reads v, writes p

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
    const bool masked = R == UpdateRule::OneBitApply && mask != nullptr;
    const AdamConsts c = consts[meta.tag[t]];
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    const int64_t stride = int64_t(blockDim.x) * kUpdateIlp;

    for (int64_t base = begin + threadIdx.x; base < end; base += stride) {
      float p[kUpdateIlp], mm[kUpdateIlp], vv[kUpdateIlp], g[kUpdateIlp], mk[kUpdateIlp];
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i < end) {
          if constexpr (kReadsGrad) g[k] = load_float<Grad>(grad, i);
          if constexpr (kUsesParam) p[k] = master[i];
          mm[k] = m[i];
          if constexpr (kUsesParam) vv[k] = v[i];
          if constexpr (R == UpdateRule::OneBitApply) mk[k] = masked ? mask[i] : 1.0f;
        }
      }
#pragma unroll
      for (int k = 0; k < kUpdateIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i >= end) continue;
        if constexpr (R == UpdateRule::OneBitApply) {
          if (masked) {
            mm[k] = ScalarOps::mul(mm[k], mk[k]);
            m[i] = mm[k];
          }
          onebit_apply<ScalarOps>(p[k], mm[k], vv[k], c);
        } else {
          const float gk = ScalarOps::mul(ScalarOps::mul(g[k], mul1), mul2);
          if constexpr (R == UpdateRule::OneBitMomentum) {
            onebit_momentum<ScalarOps>(mm[k], gk, c);
            m[i] = mm[k];
            continue;  // the parameter waits for the compressed allreduce
          } else {
            if constexpr (R == UpdateRule::Adam) adam_update<ScalarOps>(p[k], mm[k], vv[k], gk, c);
            else onebit_warmup<ScalarOps>(p[k], mm[k], vv[k], gk, c);
            m[i] = mm[k];
            v[i] = vv[k];
          }
        }
        master[i] = p[k];
        if constexpr (Param16 != DType::F32) store_float<Param16>(param16, i, p[k]);
      }
    }
  }
};

}  // namespace cuda
}  // namespace dsopt
