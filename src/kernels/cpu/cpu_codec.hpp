// CPU kernels of the block codecs (see Kernels::codec_*): the blocks of
// every run are spread over the threads; each block is encoded, and each
// element summed, exactly as math/block_codec.hpp says, whatever the
// thread count.
#pragma once
#include <cstdint>

#include "math/block_codec.hpp"

namespace dsopt {
namespace cpu_codec {

void encode(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
            uint8_t* e_out, int64_t n, int runs, uint8_t* out, int threads);
void decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n, float* dst,
                int threads);

}  // namespace cpu_codec
}  // namespace dsopt
