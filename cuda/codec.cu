// launch_codec_encode / launch_codec_decode_sum: one thread per block
// record, running the block functions of math/block_codec.hpp, so the bytes
// and sums equal the CPU kernels' bit for bit.
#include <algorithm>

#include "cuda_check.hpp"
#include "launch.hpp"
#include "math/block_codec.hpp"

namespace dsopt {
namespace cuda {
namespace {

constexpr int kCodecThreads = 128;

__global__ void encode_kernel(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in,
                              float e_mul, uint8_t* e_out, int64_t n, int64_t per_run,
                              int64_t total, uint8_t* out) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= total) return;
  const int64_t j = b / per_run, k = b % per_run;
  const int64_t first = j * n + k * block;
  const int64_t len = n - k * block < block ? n - k * block : block;
  // The residual's int8 record of this block.
  const int64_t e_at = j * codec_run_bytes(BlockCodec::Int8, block, n) +
                       k * codec_record_bytes(BlockCodec::Int8, block);
  encode_block(c, block, g + first, e_in ? e_in + e_at : nullptr, e_mul, len,
               out + j * codec_run_bytes(c, block, n) + k * codec_record_bytes(c, block),
               e_out ? e_out + e_at : nullptr);
}

// One thread per element: the sum over runs in run order.
__global__ void decode_sum_kernel(BlockCodec c, int64_t block, const uint8_t* in, int runs,
                                  int64_t n, float* dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t run_bytes = codec_run_bytes(c, block, n);
  const uint8_t* rec = in + (i / block) * codec_record_bytes(c, block);
  float sum = decode_element(c, rec, i % block);
  for (int j = 1; j < runs; ++j)
    sum = CodecOps::add(sum, decode_element(c, rec + int64_t(j) * run_bytes, i % block));
  dst[i] = sum;
}

unsigned grid(int64_t items) { return unsigned((items + kCodecThreads - 1) / kCodecThreads); }

}  // namespace

void launch_codec_encode(cudaStream_t stream, BlockCodec c, int64_t block, const float* g,
                         const uint8_t* e_in, float e_mul, uint8_t* e_out, int64_t n, int runs,
                         uint8_t* out) {
  const int64_t per_run = (n + block - 1) / block;
  const int64_t total = per_run * runs;
  if (total <= 0) return;
  encode_kernel<<<grid(total), kCodecThreads, 0, stream>>>(c, block, g, e_in, e_mul, e_out, n,
                                                            per_run, total, out);
  DSOPT_CUDA_CHECK(cudaGetLastError());
}

void launch_codec_decode_sum(cudaStream_t stream, BlockCodec c, int64_t block, const uint8_t* in,
                             int runs, int64_t n, float* dst) {
  if (n <= 0) return;
  decode_sum_kernel<<<grid(n), kCodecThreads, 0, stream>>>(c, block, in, runs, n, dst);
  DSOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace dsopt
