#include "kernels/cpu/cpu_codec.hpp"

#include <algorithm>

namespace dsopt {
namespace cpu_codec {

void encode(BlockCodec c, int64_t block, const float* g, const float* e_in, float e_mul,
            float* err_out, int64_t n, int runs, uint8_t* out, int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
  const int64_t total = per_run * int64_t(runs);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t b = 0; b < total; ++b) {
    const int64_t j = b / per_run, k = b % per_run;
    const int64_t first = j * n + k * block;
    const int64_t len = std::min(block, n - k * block);
    encode_block(c, block, g + first, e_in ? e_in + first : nullptr, e_mul, len,
                 out + j * run_bytes + k * record, err_out ? err_out + first : nullptr);
  }
}

void decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n, float* dst,
                int threads) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const int64_t record = codec_record_bytes(c, block);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t k = 0; k < per_run; ++k) {
    const int64_t len = std::min(block, n - k * block);
    float* d = dst + k * block;
    for (int64_t i = 0; i < len; ++i) d[i] = decode_element(c, in + k * record, i);
    for (int j = 1; j < runs; ++j) {
      const uint8_t* rec = in + int64_t(j) * run_bytes + k * record;
      for (int64_t i = 0; i < len; ++i) d[i] += decode_element(c, rec, i);
    }
  }
}

}  // namespace cpu_codec
}  // namespace dsopt
