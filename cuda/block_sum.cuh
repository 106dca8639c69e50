// Sums of squares on the device in the order of math/sum_squares.hpp: each
// of a block's kSumLanes threads is one lane (its squares added in double, in
// element order), then the fixed lane tree. Shared by every kernel that
// sums squares, so they all agree with the CPU bit for bit.
#pragma once
#include "math/sum_squares.hpp"

namespace dsopt {
namespace cuda {

// acc + v^2 in double, never fused.
__device__ __forceinline__ double add_square(double acc, float v) {
  return __dadd_rn(acc, __dmul_rn(double(v), double(v)));
}

// Combines the block's lane partials with the fixed tree; thread 0 stores
// the block's sum in *out. Every thread of the block must call it.
__device__ __forceinline__ void store_block_sum(double acc, double* out) {
  __shared__ double lanes[kSumLanes];
  const int lane = threadIdx.x;
  lanes[lane] = acc;
  __syncthreads();
#pragma unroll
  for (int s = kSumLanes / 2; s >= 1; s >>= 1) {
    if (lane < s) lanes[lane] = __dadd_rn(lanes[lane], lanes[lane + s]);
    __syncthreads();
  }
  if (lane == 0) *out = lanes[0];
}

}  // namespace cuda
}  // namespace dsopt
