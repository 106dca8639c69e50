// CPU kernels of the block codecs (see Kernels::codec_*): the blocks of
// every run are spread over the threads and run by the instruction set's
// loops (cpu_codec_loops.hpp); each block is encoded, and each element
// summed, exactly as math/block_codec.hpp says, whatever the thread count
// and the instruction set.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_isa.hpp"

namespace dsopt {
namespace cpu_codec {

void encode(const CpuIsa& isa, BlockCodec c, int64_t block, const float* g, const uint8_t* e_in,
            float e_mul, uint8_t* e_out, int64_t n, int runs, uint8_t* out, int threads);
void decode_sum(const CpuIsa& isa, BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n,
                float* dst, int threads);

}  // namespace cpu_codec
}  // namespace dsopt
