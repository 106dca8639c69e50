// Tensor lists for the multi-tensor kernels (apex multi_tensor_apply
// style): a list of tensors, each with `Depth` addresses, is cut into chunks
// of `chunk_size` elements; one CUDA block runs the algorithm's functor on
// one (tensor, chunk) pair. The metadata travels by value in the kernel
// parameters (__grid_constant__, under the 4 KB limit) with 64-bit sizes.
// Unlike apex, a block finds its tensor by a binary search over the
// tensors' first chunk indices instead of a per-block table, so one launch
// covers up to kMaxTensors whole tensors of any size: launches per call
// grow with the tensor count only, never with the element count.
// multi_tensor_apply.cuh launches; this header holds no runtime calls.
#pragma once
#include <cstdint>
#include <string>

#include "base/error.hpp"

namespace dsopt {
namespace cuda {

// Bytes of kernel parameters the metadata may take; the rest of the 4 KB
// is left to the functor and the chunk size.
constexpr int kMetaBudget = 3840;

template <int Depth>
struct TensorListMeta {
  static constexpr int kPerTensor = Depth * 8 + 8 + 8 + 4;
  static constexpr int kMaxTensors = (kMetaBudget - 8) / kPerTensor;

  void* addr[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int64_t first_chunk[kMaxTensors];  // the tensor's first block index in this launch
  int32_t tag[kMaxTensors];          // the functor's per-tensor value (e.g. group index)
  int32_t count;
};

// One tensor as the caller lists it.
template <int Depth>
struct TensorListEntry {
  void* addr[Depth];
  int64_t numel;
  int32_t tag;
};

// Index of the tensor whose chunks contain `block`: the last t with
// first_chunk[t] <= block (first_chunk[0] == 0, increasing).
template <int Depth>
__device__ __forceinline__ int find_tensor(const TensorListMeta<Depth>& meta, int64_t block) {
  int lo = 0, hi = meta.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (meta.first_chunk[mid] <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// The one kernel: block b runs `f` on its (tensor, chunk). At most 512
// threads per block; two blocks per SM cap the registers at 64 per thread,
// which keeps the 16-bit Adam variants (about 110 registers unbounded, a
// few bytes of spill bounded) at 32 resident warps instead of 16.
template <int Depth, class Functor>
__global__ void __launch_bounds__(512, 2)
    multi_tensor_kernel(const __grid_constant__ TensorListMeta<Depth> meta, int64_t chunk_size,
                        const __grid_constant__ Functor f) {
  const int64_t block = blockIdx.x;
  const int t = find_tensor(meta, block);
  f(meta, t, block - meta.first_chunk[t], chunk_size);
}

// Cuts the list into launches: calls launch(meta, blocks) for each group of
// at most kMaxTensors tensors (and at most 2^31 - 1 blocks). Tensors with
// numel 0 are skipped.
template <int Depth, class Launch>
void for_each_launch(const TensorListEntry<Depth>* tensors, int64_t count, int64_t chunk_size,
                     Launch&& launch) {
  using Meta = TensorListMeta<Depth>;
  constexpr int64_t kMaxGrid = 0x7FFFFFFF;
  Meta meta;
  meta.count = 0;
  int64_t blocks = 0;
  auto flush = [&] {
    if (meta.count == 0) return;
    launch(meta, blocks);
    meta.count = 0;
    blocks = 0;
  };
  for (int64_t i = 0; i < count; ++i) {
    const TensorListEntry<Depth>& e = tensors[i];
    if (e.numel <= 0) continue;
    const int64_t c = (e.numel + chunk_size - 1) / chunk_size;
    if (c > kMaxGrid)
      fail(DSOPT_EUNSUPPORTED, "tensor of " + std::to_string(e.numel) + " elements is too large");
    if (blocks + c > kMaxGrid) flush();
    const int s = meta.count++;
    for (int d = 0; d < Depth; ++d) meta.addr[d][s] = e.addr[d];
    meta.numel[s] = e.numel;
    meta.first_chunk[s] = blocks;
    meta.tag[s] = e.tag;
    blocks += c;
    if (meta.count == Meta::kMaxTensors) flush();
  }
  flush();
}

}  // namespace cuda
}  // namespace dsopt
