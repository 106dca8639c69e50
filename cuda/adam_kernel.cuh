// The Adam/AdamW functor for the multi-tensor kernel: every element runs
// adam_update<ScalarOps> from math/adam.hpp, the same function the CPU
// kernels run, so both give the same bits.
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "math/adam.hpp"
#include "math/scalar_ops.hpp"

namespace dsopt {
namespace cuda {

// Addresses of one Adam tensor in the tensor list.
enum AdamAddr { kMaster, kParam16, kGrad, kExpAvg, kExpAvgSq, kAdamDepth };

constexpr int kAdamChunk = 65536;  // elements per block (spec adam.md 2.6)
constexpr int kAdamThreads = 512;
constexpr int kAdamIlp = 4;  // elements in flight per thread

// `Param16` is the dtype of the 16-bit parameter copy, or F32 for none.
template <DType Param16, DType Grad>
struct AdamFunctor {
  const AdamConsts* consts;  // device memory, indexed by the tensor's tag (group)
  float mul1, mul2;

  __device__ __forceinline__ void operator()(const TensorListMeta<kAdamDepth>& meta, int t,
                                             int64_t chunk, int64_t chunk_size) const {
    float* __restrict__ master = static_cast<float*>(meta.addr[kMaster][t]);
    void* param16 = meta.addr[kParam16][t];
    const void* grad = meta.addr[kGrad][t];
    float* __restrict__ m = static_cast<float*>(meta.addr[kExpAvg][t]);
    float* __restrict__ v = static_cast<float*>(meta.addr[kExpAvgSq][t]);
    const AdamConsts c = consts[meta.tag[t]];
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    const int64_t stride = int64_t(blockDim.x) * kAdamIlp;

    for (int64_t base = begin + threadIdx.x; base < end; base += stride) {
      float p[kAdamIlp], mm[kAdamIlp], vv[kAdamIlp], g[kAdamIlp];
#pragma unroll
      for (int k = 0; k < kAdamIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i < end) {
          g[k] = load_float<Grad>(grad, i);
          p[k] = master[i];
          mm[k] = m[i];
          vv[k] = v[i];
        }
      }
#pragma unroll
      for (int k = 0; k < kAdamIlp; ++k) {
        const int64_t i = base + int64_t(k) * blockDim.x;
        if (i < end) {
          float gk = ScalarOps::mul(g[k], mul1);
          gk = ScalarOps::mul(gk, mul2);
          adam_update<ScalarOps>(p[k], mm[k], vv[k], gk, c);
          master[i] = p[k];
          m[i] = mm[k];
          v[i] = vv[k];
          if constexpr (Param16 != DType::F32) store_float<Param16>(param16, i, p[k]);
        }
      }
    }
  }
};

}  // namespace cuda
}  // namespace dsopt
