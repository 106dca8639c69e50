// Loads and stores of V::W elements of a tensor in its storage dtype, as
// fp32 vectors (VecScalar: one element).
#pragma once
#include <cstdint>

#include "base/dtype.hpp"
#include "math/hd.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN
namespace cpu {

template <class V, DType T>
inline typename V::F load(const void* base, int64_t i) {
  if constexpr (T == DType::F32) return V::load(static_cast<const float*>(base) + i);
  else if constexpr (T == DType::F16) return V::load_f16(static_cast<const uint16_t*>(base) + i);
  else return V::load_bf16(static_cast<const uint16_t*>(base) + i);
}

template <class V, DType T>
inline void store(void* base, int64_t i, typename V::F x) {
  if constexpr (T == DType::F32) V::store(static_cast<float*>(base) + i, x);
  else if constexpr (T == DType::F16) V::store_f16(static_cast<uint16_t*>(base) + i, x);
  else V::store_bf16(static_cast<uint16_t*>(base) + i, x);
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
