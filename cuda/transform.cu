// launch_transform (tensors grouped by dtype, one multi-tensor launch
// sequence per dtype present) and the single-tensor conversions.
#include <vector>

#include "convert_kernel.cuh"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "multi_tensor_apply.cuh"
#include "transform_kernel.cuh"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace cuda {
namespace {

using TransformEntry = TensorListEntry<kTransformDepth>;

template <DType Src>
void run(cudaStream_t stream, const std::vector<TransformEntry>& list, float mul, bool add,
         int* flag) {
  if (list.empty()) return;
  const TransformFunctor<Src> f{mul, add, flag};
  multi_tensor_apply<kTransformDepth>(stream, kSumLanes, kSumBlock, list.data(),
                                      static_cast<int64_t>(list.size()), f);
}

template <DType From, DType To>
void convert(cudaStream_t stream, const void* src, void* dst, int64_t n) {
  if (n <= 0) return;
  convert_kernel<From, To><<<convert_blocks(n), kConvertThreads, 0, stream>>>(src, dst, n);
  DSOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_transform(cudaStream_t stream, const TensorRef* src, int64_t count, float mul,
                      float* dst, bool add, double* block_sums_dev, int* nonfinite_dev) {
  std::vector<TransformEntry> lists[3];  // f32, f16, bf16
  int64_t dst_offset = 0, sums_offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    const TensorRef& t = src[i];
    TransformEntry e;
    e.addr[kSrc] = const_cast<void*>(t.data);
    e.addr[kDst] = dst != nullptr ? dst + dst_offset : nullptr;
    e.addr[kBlockSums] = block_sums_dev != nullptr ? block_sums_dev + sums_offset : nullptr;
    e.numel = t.numel;
    e.tag = static_cast<int32_t>(i);
    dst_offset += t.numel;
    sums_offset += sum_blocks(t.numel);
    lists[t.dtype == DType::F32 ? 0 : t.dtype == DType::F16 ? 1 : 2].push_back(e);
  }
  run<DType::F32>(stream, lists[0], mul, add, nonfinite_dev);
  run<DType::F16>(stream, lists[1], mul, add, nonfinite_dev);
  run<DType::BF16>(stream, lists[2], mul, add, nonfinite_dev);
}

void launch_to_float(cudaStream_t stream, const TensorRef& src, float* dst) {
  switch (src.dtype) {
    case DType::F32: convert<DType::F32, DType::F32>(stream, src.data, dst, src.numel); break;
    case DType::F16: convert<DType::F16, DType::F32>(stream, src.data, dst, src.numel); break;
    case DType::BF16: convert<DType::BF16, DType::F32>(stream, src.data, dst, src.numel); break;
  }
}

void launch_from_float(cudaStream_t stream, const float* src, void* dst, DType dtype, int64_t n) {
  switch (dtype) {
    case DType::F32: convert<DType::F32, DType::F32>(stream, src, dst, n); break;
    case DType::F16: convert<DType::F32, DType::F16>(stream, src, dst, n); break;
    case DType::BF16: convert<DType::F32, DType::BF16>(stream, src, dst, n); break;
  }
}

cudaError_t probe_kernel_image() {
  cudaFuncAttributes attr;
  const cudaError_t err = cudaFuncGetAttributes(&attr, convert_kernel<DType::F32, DType::F32>);
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

}  // namespace cuda
}  // namespace dsopt
