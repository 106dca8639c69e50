// The gradient pass for the multi-tensor kernel: y = fl(float(x) * mul), written
// out when asked, Inf/NaN detection on x, and per-block sums of y^2 in the
// order of math/sum_squares.hpp: one CUDA block of kSumLanes threads per
// block of kSumBlock elements, lane j adding y[j], y[j + kSumLanes], ... in
// double, then the fixed lane tree. The host adds the block sums of a
// tensor in block order, as the CPU does.
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "block_sum.cuh"
#include "element_io.cuh"
#include "tensor_list.cuh"
#include "math/scalar_ops.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace cuda {

// Addresses of one tensor in the tensor list: the input, where its y values
// go (nullptr: nowhere) and where its block sums go (nullptr: not wanted).
enum TransformAddr { kSrc, kDst, kBlockSums, kTransformDepth };

template <DType Src>
struct TransformFunctor {
  float mul;
  bool add;        // dst = fl(dst + y) instead of dst = y
  int* nonfinite;  // device flag, set to 1 when some x is Inf or NaN

  __device__ __forceinline__ void operator()(const TensorListMeta<kTransformDepth>& meta, int t,
                                             int64_t chunk, int64_t chunk_size) const {
    const void* src = meta.addr[kSrc][t];
    float* dst = static_cast<float*>(meta.addr[kDst][t]);
    double* block_sums = static_cast<double*>(meta.addr[kBlockSums][t]);
    const int64_t begin = chunk * chunk_size;
    const int64_t end = min(meta.numel[t], begin + chunk_size);
    const int lane = threadIdx.x;
    const bool want_sums = block_sums != nullptr;

    bool bad = false;
    double acc = 0.0;
    for (int64_t i = begin + lane; i < end; i += kSumLanes) {
      const float x = load_float<Src>(src, i);
      bad |= is_nonfinite(x);
      const float y = ScalarOps::mul(x, mul);
      if (dst != nullptr) dst[i] = add ? ScalarOps::add(dst[i], y) : y;
      if (want_sums) acc = add_square(acc, y);
    }
    if (__syncthreads_or(bad) && lane == 0) *nonfinite = 1;

    if (!want_sums) return;  // uniform over the block
    store_block_sum(acc, &block_sums[chunk]);
  }
};

}  // namespace cuda
}  // namespace dsopt
