#include "kernels/cpu/cpu_codec.hpp"

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

void encode(BlockCodec c, int64_t block, const float* g, const float* e_in, float e_mul,
            float* err_out, int64_t n, int runs, uint8_t* out, int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  const int64_t total = per_run * int64_t(runs);
  with_codec(c, [&](auto codec) {
#pragma omp parallel num_threads(threads)
    {
      // x = fl(g + fl(e e_mul)) of a block, formed once: the block
      // function's loops then read one stream and vectorize.
      std::vector<float> x(e_in ? size_t(block) : 0);
#pragma omp for schedule(static)
      for (int64_t b = 0; b < total; ++b) {
        const int64_t j = b / per_run, k = b % per_run;
        const int64_t first = j * n + k * block;
        const int64_t len = std::min(block, n - k * block);
        const float* values = g + first;
        if (e_in) {
          const float* e = e_in + first;
          for (int64_t i = 0; i < len; ++i) x[size_t(i)] = codec_input(values, e, e_mul, i);
          values = x.data();
        }
        encode_block(codec(), block, values, nullptr, 1.0f, len, out + j * run_bytes + k * record,
                     err_out ? err_out + first : nullptr);
      }
    }
  });
}

void decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n, float* dst,
                int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  with_codec(c, [&](auto codec) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t k = 0; k < per_run; ++k) {
      const int64_t len = std::min(block, n - k * block);
      for (int j = 0; j < runs; ++j)
        decode_block(codec(), in + int64_t(j) * run_bytes + k * record, len, dst + k * block, j > 0);
    }
  });
}

}  // namespace cpu_codec
}  // namespace dsopt
