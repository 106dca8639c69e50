// The one multi-tensor launcher: runs an algorithm's functor over every
// chunk of every tensor of a list (see tensor_list.cuh), on one stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_check.hpp"
#include "tensor_list.cuh"

namespace dsopt {
namespace cuda {

// `block_threads` threads per block, `chunk_size` elements per block.
template <int Depth, class Functor>
void multi_tensor_apply(cudaStream_t stream, int block_threads, int64_t chunk_size,
                        const TensorListEntry<Depth>* tensors, int64_t count, const Functor& f) {
  static_assert(sizeof(TensorListMeta<Depth>) + sizeof(Functor) + sizeof(int64_t) <= 4096,
                "kernel parameters over the 4 KB limit");
  for_each_launch(tensors, count, chunk_size, [&](const TensorListMeta<Depth>& meta, int64_t blocks) {
    multi_tensor_kernel<Depth, Functor>
        <<<static_cast<unsigned>(blocks), block_threads, 0, stream>>>(meta, chunk_size, f);
    DSOPT_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace cuda
}  // namespace dsopt
