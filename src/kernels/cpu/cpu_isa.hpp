// The CPU kernels of one instruction set, as a table of range functions.
// The driver (cpu_kernels.cpp) splits work into ranges and calls
// them; each isa_*.cpp fills the table from the templates in cpu_loops.hpp
// and update_loop.hpp.
#pragma once
#include <cstdint>

#include "kernels/kernels.hpp"
#include "math/block_codec.hpp"

namespace dsopt {

// One sum block of a tensor for the gradient pass: elements [begin, begin +
// len) of src (begin a multiple of kSumBlock, 0 < len <= kSumBlock).
struct PassBlock {
  const void* src;  // the tensor's first element
  int64_t begin;
  int64_t len;
  float* dst;   // where element `begin`'s y goes, or null
  double* sum;  // the block's sum of squares, or null
};

struct CpuIsa {
  const char* name;
  // An update rule over elements [begin, end) of one slot; `consts` is
  // the slot's record of the rule's constants. With block_sums (rules that
  // read the gradient), [begin, end) are whole sum blocks of the slot and
  // block_sums[j] receives the j-th's sum of squares of the gradient
  // values read (before mul1 and mul2), as transform() sums them.
  void (*update_range)(UpdateRule rule, const UpdateSlot& slot, int64_t begin, int64_t end,
                       const void* consts, float mul1, float mul2, double* block_sums);
  // Sum blocks of one dtype (PassBlock; dst and sum each null in every
  // block or in none): y = fl(x * mul) into each block's dst, or with `add`
  // dst = fl(dst + y); each block's sum of the values written (y without
  // `add`) squared into its `sum`. Returns true when some x is Inf or NaN.
  // (A check alone is check_range.)
  bool (*transform_blocks)(DType dtype, const PassBlock* blocks, int64_t count, float mul, bool add);
  // Whether elements [begin, end) of a tensor hold an Inf or NaN.
  bool (*check_range)(const TensorRef& src, int64_t begin, int64_t end);
  // dst[i] = round(src[i]) to dtype, i in [begin, end).
  void (*from_float_range)(const float* src, void* dst, DType dtype, int64_t begin, int64_t end);

  // The compressed allreduce over one sum block [begin, end) of a tensor
  // (see Kernels::car_*; cpu_car.cpp runs the blocks).
  double (*car_worker_sumsq_block)(const CarTensor& t, int64_t begin, int64_t end);
  void (*car_worker_pack_block)(const CarTensor& t, int64_t begin, int64_t end, int world,
                                float scale, uint8_t* send, int64_t msg_bytes);
  double (*car_server_sum_block)(const CarTensor& t, int64_t begin, int64_t end, int world,
                                 const uint8_t* recv, int64_t msg_bytes, const float* weights,
                                 int64_t count, size_t tensor);
  void (*car_server_pack_block)(const CarTensor& t, int64_t begin, int64_t end, float scale,
                                uint8_t* out);
  void (*car_decode_block)(const CarTensor& t, int64_t begin, int64_t end, int world,
                           const uint8_t* gathered, int64_t msg_bytes, const float* scales,
                           int64_t count, size_t tensor);

  // The block codecs over blocks [first, last) (see Kernels::codec_*;
  // cpu_codec.cpp spreads the blocks over the threads): an encode of
  // `runs` runs of n values, block b being block b % ceil(n / block) of
  // run b / ceil(n / block); the decode and sum of blocks k of every run.
  void (*codec_encode_blocks)(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in,
                              float e_mul, uint8_t* e_out, int64_t n, uint8_t* out, int64_t first,
                              int64_t last);
  void (*codec_decode_blocks)(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n,
                              float* dst, int64_t first, int64_t last);
};

const CpuIsa& cpu_isa_scalar();
const CpuIsa& cpu_isa_avx2();
const CpuIsa& cpu_isa_avx512();

}  // namespace dsopt
