// launch_car: one launch of a compressed-allreduce kernel over every tensor.
#include "car_kernels.cuh"
#include "cuda_check.hpp"
#include "launch.hpp"

namespace dsopt {
namespace cuda {

void launch_car(cudaStream_t stream, CarOp op, const CarArgs& args, int64_t blocks) {
  if (blocks <= 0) return;
  if (blocks > 0x7FFFFFFF) fail(DSOPT_EUNSUPPORTED, "compressed allreduce: too many elements in one call");
  const dim3 grid(static_cast<unsigned>(blocks)), block(kSumLanes);
  switch (op) {
    case CarOp::WorkerSumsq: car_worker_sumsq_kernel<<<grid, block, 0, stream>>>(args); break;
    case CarOp::WorkerPack: car_worker_pack_kernel<<<grid, block, 0, stream>>>(args); break;
    case CarOp::ServerSum: car_server_sum_kernel<<<grid, block, 0, stream>>>(args); break;
    case CarOp::ServerPack: car_server_pack_kernel<<<grid, block, 0, stream>>>(args); break;
    case CarOp::Decode: car_decode_kernel<<<grid, block, 0, stream>>>(args); break;
  }
  DSOPT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace dsopt
