// The CPU kernels of one instruction set, as a table of range functions.
// The OpenMP driver (cpu_kernels.cpp) splits work into ranges and calls
// them; each isa_*.cpp fills the table from the templates in cpu_loops.hpp.
#pragma once
#include <cstdint>

#include "kernels/kernels.hpp"

namespace dsopt {

struct CpuIsa {
  const char* name;
  // An update rule over elements [begin, end) of one slot.
  void (*update_range)(UpdateRule rule, const AdamSlot& slot, int64_t begin, int64_t end,
                       const AdamConsts& c, float mul1, float mul2);
  // One sum block [begin, end) of a tensor (end - begin <= kSumBlock):
  // y = fl(x * mul) into dst (dst[0] is element `begin`; may be null), the
  // block's sum of y^2 into *block_sum (may be null). Returns true when some
  // x is Inf or NaN.
  bool (*transform_block)(const TensorRef& src, int64_t begin, int64_t end, float mul, float* dst,
                          double* block_sum);
  // dst[i] = round(src[i]) to dtype, i in [begin, end).
  void (*from_float_range)(const float* src, void* dst, DType dtype, int64_t begin, int64_t end);
};

const CpuIsa& cpu_isa_scalar();
const CpuIsa& cpu_isa_avx2();
const CpuIsa& cpu_isa_avx512();

}  // namespace dsopt
