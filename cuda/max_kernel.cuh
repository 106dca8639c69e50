// The per-tensor maximum of Kernels::max_per_tensor (1-bit LAMB's
// denominator ratios) for the multi-tensor kernel.
#pragma once
#include <cstdint>

#include "tensor_list.cuh"

namespace dsopt {
namespace cuda {

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
