#include "kernels/cpu/cpu_codec.hpp"

#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace dsopt {
namespace cpu_codec {
namespace {

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

}  // namespace

void encode(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
            uint8_t* e_out, int64_t n, int runs, uint8_t* out, int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  const int64_t e_run_bytes = codec_run_bytes(BlockCodec::Int8, block, n);
  const int64_t e_record = codec_record_bytes(BlockCodec::Int8, block);
  const int64_t total = per_run * int64_t(runs);
  with_codec(c, [&](auto codec) {
    parallel_for(threads, total, [&](int64_t b) {
      // A block's x = fl(g + fl(e e_mul)) and what its encoding lost, each
      // formed once in a loop of its own that vectorizes.
      thread_local std::vector<float> x, lost;
      const int64_t j = b / per_run, k = b % per_run;
      const int64_t first = j * n + k * block;
      const int64_t len = std::min(block, n - k * block);
      const int64_t e_at = j * e_run_bytes + k * e_record;
      const float* values = g + first;
      if (e_in) {
        x.resize(size_t(block));
        decode_block(BlockCodec::Int8, e_in + e_at, len, x.data(), false);
        for (int64_t i = 0; i < len; ++i)
          x[size_t(i)] = CodecOps::add(values[i], CodecOps::mul(x[size_t(i)], e_mul));
        values = x.data();
      }
      uint8_t* rec = out + j * run_bytes + k * record;
      encode_values(codec(), block, PlainValues{values}, len, rec);
      if (e_out) {
        lost.resize(size_t(block));
        const LostValues<PlainValues> lost_of{PlainValues{values}, codec(), rec, record_scale(rec)};
        for (int64_t i = 0; i < len; ++i) lost[size_t(i)] = lost_of(i);
        encode_values(BlockCodec::Int8, block, PlainValues{lost.data()}, len, e_out + e_at);
      }
    });
  });
}

void decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n, float* dst,
                int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  with_codec(c, [&](auto codec) {
    parallel_for(threads, per_run, [&](int64_t k) {
      const int64_t len = std::min(block, n - k * block);
      for (int j = 0; j < runs; ++j)
        decode_block(codec(), in + int64_t(j) * run_bytes + k * record, len, dst + k * block, j > 0);
    });
  });
}

}  // namespace cpu_codec
}  // namespace dsopt
