// Elementwise dtype conversions of one tensor (to_float / from_float).
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "element_io.cuh"

namespace dsopt {
namespace cuda {

constexpr int kConvertThreads = 256;
constexpr int64_t kConvertMaxBlocks = 65536;

template <DType From, DType To>
__global__ void convert_kernel(const void* __restrict__ src, void* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_float<To>(dst, i, load_float<From>(src, i));
}

inline unsigned convert_blocks(int64_t n) {
  const int64_t b = (n + kConvertThreads - 1) / kConvertThreads;
  return static_cast<unsigned>(b < kConvertMaxBlocks ? b : kConvertMaxBlocks);
}

}  // namespace cuda
}  // namespace dsopt
