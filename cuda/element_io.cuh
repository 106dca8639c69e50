// Loads and stores of one element in its storage dtype, as fp32 in
// registers. Conversions are the bit-exact ones of math/half.hpp, so the
// CUDA kernels read and write the same bits as the CPU kernels.
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "math/half.hpp"

namespace dsopt {
namespace cuda {

template <DType T>
__device__ __forceinline__ float load_float(const void* base, int64_t i) {
  if constexpr (T == DType::F32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (T == DType::F16) {
    return f16_to_float(static_cast<const uint16_t*>(base)[i]);
  } else {
    return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
  }
}

template <DType T>
__device__ __forceinline__ void store_float(void* base, int64_t i, float x) {
  if constexpr (T == DType::F32) {
    static_cast<float*>(base)[i] = x;
  } else if constexpr (T == DType::F16) {
    static_cast<uint16_t*>(base)[i] = float_to_f16(x);
  } else {
    static_cast<uint16_t*>(base)[i] = float_to_bf16(x);
  }
}

__device__ __forceinline__ bool is_nonfinite(float x) {
  return (float_bits(x) & 0x7F800000u) == 0x7F800000u;
}

}  // namespace cuda
}  // namespace dsopt
