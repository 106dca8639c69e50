// The 1-bit LAMB functors for the multi-tensor kernel: every element runs
// the function of math/onebit_lamb.hpp with ScalarOps, loading and storing
// what the CPU's lamb_rule_at (src/kernels/cpu/cpu_loops.hpp) does, so both
// give the same bits. A separate list depth from UpdateFunctor keeps the
// Adam rules' metadata (and tensors per launch) as they were.
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "kernels/kernels.hpp"
#include "math/onebit_lamb.hpp"
#include "math/scalar_ops.hpp"

namespace dsopt {
namespace cuda {

enum LambAddr { kLMaster, kLParam16, kLGrad, kLExpAvg, kLExpAvgSq, kLFresh, kLU, kLAux, kLRatio,
                kLMask, kLambDepth };

constexpr int kLambChunk = 65536;
constexpr int kLambThreads = 512;

template <UpdateRule R, DType Param16, DType Grad>
struct LambFunctor {
  const AdamConsts* consts;  // device memory, one per tensor (the tag)
  float mul1, mul2;

  __device__ __forceinline__ void operator()(const TensorListMeta<kLambDepth>& meta, int t,
                                             int64_t chunk, int64_t chunk_size) const {
    float* master = static_cast<float*>(meta.addr[kLMaster][t]);
    void* param16 = meta.addr[kLParam16][t];
    const void* grad = meta.addr[kLGrad][t];
    float* m = static_cast<float*>(meta.addr[kLExpAvg][t]);
    float* v = static_cast<float*>(meta.addr[kLExpAvgSq][t]);
    float* vf = static_cast<float*>(meta.addr[kLFresh][t]);
    float* u = static_cast<float*>(meta.addr[kLU][t]);
    float* aux = static_cast<float*>(meta.addr[kLAux][t]);
    float* ratio = static_cast<float*>(meta.addr[kLRatio][t]);
    const float* mask = static_cast<const float*>(meta.addr[kLMask][t]);
    const AdamConsts c = consts[meta.tag[t]];
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      if constexpr (R == UpdateRule::LambApply) {
        float p = master[i];
        lamb_apply<ScalarOps>(p, u[i], c);
        master[i] = p;
        if constexpr (Param16 != DType::F32) store_float<Param16>(param16, i, p);
      } else if constexpr (R == UpdateRule::LambCompressed) {
        float mm = m[i], f = vf[i], u0, uu, r;
        lamb_compressed<ScalarOps>(master[i], mm, aux[i], mask ? mask[i] : 1.0f, v[i], f, u0, uu,
                                   r, c);
        m[i] = mm;
        vf[i] = f;
        aux[i] = u0;
        u[i] = uu;
        ratio[i] = r;
      } else {
        const float g = ScalarOps::mul(ScalarOps::mul(load_float<Grad>(grad, i), mul1), mul2);
        float mm = m[i];
        if constexpr (R == UpdateRule::LambMomentum) {
          float m_prev;
          lamb_momentum<ScalarOps>(mm, m_prev, c.update_units ? v[i] : 0.0f, g, c);  // v only where used
          aux[i] = m_prev;
        } else {
          float vv = v[i], uu;
          lamb_warmup<ScalarOps>(master[i], mm, vv, uu, g, c);
          v[i] = vv;
          u[i] = uu;
        }
        m[i] = mm;
      }
    }
  }
};

// Per-tensor maximum of non-negative fp32 values: their bit patterns order
// like the values, so an integer atomicMax per block gives the exact maximum
// whatever the block order.
struct MaxFunctor {
  unsigned* out;  // one per tensor (the tag), cleared to 0 by the caller

  __device__ __forceinline__ void operator()(const TensorListMeta<1>& meta, int t, int64_t chunk,
                                             int64_t chunk_size) const {
    const float* x = static_cast<const float*>(meta.addr[0][t]);
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    unsigned best = 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const unsigned b = __float_as_uint(x[i]);
      best = b > best ? b : best;
    }
    for (int s = 16; s >= 1; s >>= 1) {
      const unsigned o = __shfl_down_sync(0xffffffffu, best, s);
      best = o > best ? o : best;
    }
    if ((threadIdx.x & 31) == 0) atomicMax(out + meta.tag[t], best);
  }
};

}  // namespace cuda
}  // namespace dsopt
