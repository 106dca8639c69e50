// Element types that cross the C API, and their sizes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "dsopt.h"

namespace dsopt {

enum class DType : int32_t { F32 = DSOPT_FLOAT32, F16 = DSOPT_FLOAT16, BF16 = DSOPT_BFLOAT16 };

inline bool is_valid_dtype(int32_t code) {
  return code == DSOPT_FLOAT32 || code == DSOPT_FLOAT16 || code == DSOPT_BFLOAT16;
}
inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "?";
}

}  // namespace dsopt
