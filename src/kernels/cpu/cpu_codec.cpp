#include "kernels/cpu/cpu_codec.hpp"

#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>

namespace dsopt {
namespace cpu_codec {
namespace {

// Blocks per unit of parallel work: enough that a call through the
// instruction set's table is rare, few enough to spread a bucket's blocks.
constexpr int64_t kBlocksPerItem = 16;

template <class F>
void over_blocks(int threads, int64_t blocks, F&& f) {
  parallel_for(threads, (blocks + kBlocksPerItem - 1) / kBlocksPerItem, [&](int64_t item) {
    const int64_t first = item * kBlocksPerItem;
    f(first, std::min(blocks, first + kBlocksPerItem));
  });
}

}  // namespace

void encode(const CpuIsa& isa, BlockCodec c, int64_t block, const float* g, const uint8_t* e_in,
            float e_mul, uint8_t* e_out, int64_t n, int runs, uint8_t* out, int threads) {
  const int64_t per_run = (n + block - 1) / block;
  over_blocks(threads, per_run * int64_t(runs), [&](int64_t first, int64_t last) {
    isa.codec_encode_blocks(c, block, g, e_in, e_mul, e_out, n, out, first, last);
  });
}

void decode_sum(const CpuIsa& isa, BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n,
                float* dst, int threads) {
  over_blocks(threads, (n + block - 1) / block, [&](int64_t first, int64_t last) {
    isa.codec_decode_blocks(c, block, in, runs, n, dst, first, last);
  });
}

}  // namespace cpu_codec
}  // namespace dsopt
