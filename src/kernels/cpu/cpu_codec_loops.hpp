// The block codecs' CPU loops over a range of blocks (math/block_codec.hpp),
// compiled once per instruction set (isa_table.hpp) so that the element
// loops vectorize at its width; V only ties an instantiation to its file.
// Every value is the same on any instruction set: one rounding per
// operation, no reassociation.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "math/block_codec.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN
namespace cpu {

// Encodes blocks [first, last) of `runs` runs of n values (block b is block
// b % per_run of run b / per_run; see Kernels::codec_encode).
template <class Codec>
void encode_blocks_c(Codec codec, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
                     uint8_t* e_out, int64_t n, uint8_t* out, int64_t first, int64_t last) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(codec(), block, n);
  const int64_t record = codec_record_bytes(codec(), block);
  const int64_t e_run_bytes = codec_run_bytes(BlockCodec::Int8, block, n);
  const int64_t e_record = codec_record_bytes(BlockCodec::Int8, block);
  // A block's x = fl(g + fl(e e_mul)) and what its encoding lost, each
  // formed once in a loop of its own.
  thread_local std::vector<float> x, lost;
  x.resize(size_t(block));
  lost.resize(size_t(block));
  for (int64_t b = first; b < last; ++b) {
    const int64_t j = b / per_run, k = b % per_run;
    const int64_t len = std::min(block, n - k * block);
    const int64_t e_at = j * e_run_bytes + k * e_record;
    const float* values = g + j * n + k * block;
    if (e_in) {
      decode_block(BlockCodec::Int8, e_in + e_at, len, x.data(), false);
      for (int64_t i = 0; i < len; ++i)
        x[size_t(i)] = CodecOps::add(values[i], CodecOps::mul(x[size_t(i)], e_mul));
      values = x.data();
    }
    uint8_t* rec = out + j * run_bytes + k * record;
    encode_values(codec(), block, PlainValues{values}, len, rec);
    if (e_out) {
      lost_values(codec(), values, rec, len, lost.data());
      encode_values(BlockCodec::Int8, block, PlainValues{lost.data()}, len, e_out + e_at);
    }
  }
}

// Calls f with the codec as a compile-time constant, so that the block
// functions' codec branches leave the element loops.
template <class F>
void with_codec(BlockCodec c, F&& f) {
  switch (c) {
    case BlockCodec::Int8: return f(std::integral_constant<BlockCodec, BlockCodec::Int8>{});
    case BlockCodec::Int4: return f(std::integral_constant<BlockCodec, BlockCodec::Int4>{});
    case BlockCodec::Sign: return f(std::integral_constant<BlockCodec, BlockCodec::Sign>{});
  }
}

template <class V>
void codec_encode_blocks(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
                         uint8_t* e_out, int64_t n, uint8_t* out, int64_t first, int64_t last) {
  with_codec(c, [&](auto codec) { encode_blocks_c(codec, block, g, e_in, e_mul, e_out, n, out, first, last); });
}

// Blocks [first, last) of the runs' sum into dst (see Kernels::codec_decode_sum).
template <class V>
void codec_decode_blocks(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n, float* dst,
                         int64_t first, int64_t last) {
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  with_codec(c, [&](auto codec) {
    for (int64_t k = first; k < last; ++k) {
      const int64_t len = std::min(block, n - k * block);
      for (int j = 0; j < runs; ++j)
        decode_block(codec(), in + int64_t(j) * run_bytes + k * record, len, dst + k * block, j > 0);
    }
  });
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
