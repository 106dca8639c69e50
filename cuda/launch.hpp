// Host entry points of the CUDA kernels, one .cu file each, so the class in
// cuda_kernels.cu stays plain runtime-API code. Every pointer is device
// memory except the slot and tensor arrays, which are host metadata. All
// work is queued on `stream`; nothing here synchronizes.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "base/dtype.hpp"
#include "car_layout.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace cuda {

// `rule` over every slot; consts_dev holds the rule's constants (its
// Consts), record slot.group for a slot, already in device memory.
void launch_update(cudaStream_t stream, UpdateRule rule, const UpdateSlot* slots, int64_t count,
                   const void* consts_dev, float mul1, float mul2);

// out_dev[i] = the bits of the maximum of non-negative fp32 tensor i;
// out_dev is cleared to 0 by the caller.
void launch_max_per_tensor(cudaStream_t stream, const TensorRef* src, int64_t count,
                           unsigned* out_dev);

// One compressed-allreduce primitive over every tensor: `blocks` blocks as
// returned by car_write_meta, whose buffer args.items/first/table point into
// (device memory).
void launch_car(cudaStream_t stream, CarOp op, const CarArgs& args, int64_t blocks);

// The transform pass. dst (may be nullptr) receives the y values of all
// tensors back to back (with `add`, dst = fl(dst + y)); block_sums_dev (may be nullptr) receives, for tensor
// i, sum_blocks(numel_i) block sums starting at the sum of sum_blocks() of
// the tensors before it; *nonfinite_dev is set to 1 when some x is Inf/NaN
// (the caller clears it first).
void launch_transform(cudaStream_t stream, const TensorRef* src, int64_t count, float mul,
                      float* dst, bool add, double* block_sums_dev, int* nonfinite_dev);

// The block codecs (Kernels::codec_encode, Kernels::codec_decode_sum).
void launch_codec_encode(cudaStream_t stream, BlockCodec c, int64_t block, const float* g,
                         const uint8_t* e_in, float e_mul, uint8_t* e_out, int64_t n, int runs,
                         uint8_t* out);
void launch_codec_decode_sum(cudaStream_t stream, BlockCodec c, int64_t block, const uint8_t* in,
                             int runs, int64_t n, float* dst);

void launch_to_float(cudaStream_t stream, const TensorRef& src, float* dst);
void launch_from_float(cudaStream_t stream, const float* src, void* dst, DType dtype, int64_t n);

// cudaSuccess when this build has code the current device can run.
cudaError_t probe_kernel_image();

}  // namespace cuda
}  // namespace dsopt
