// 1-bit Adam over NCCL on 2 ranks (mpirun -np 2, rank r on GPU r): a CUDA
// optimizer on an NCCL communicator (with the caller's stream) against a
// CPU optimizer on MPI_COMM_WORLD, the same data on each rank, across the
// warmup/compression boundary: parameters, step info (bytes_sent included)
// and state blobs bit-identical, parameters identical on every rank.
// NCCL is opened with dlopen, as libdsopt does. Skips (exit code 77, on
// every rank) unless every rank sees at least 2 CUDA devices and can load
// libnccl.so.2.
#define OMPI_SKIP_MPICXX 1
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "gpu_mpi.hpp"
#include "onebit_pair.hpp"

extern "C" {
#include "support/mpi_world.h"
}

using namespace gpu_test;

namespace {

struct Nccl {
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

[[noreturn]] void skip_everywhere(const std::string& why) {
  if (world_rank() == 0) std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  MPI_Finalize();
  std::exit(kSkipped);
}

// Skips on every rank unless every rank has 2 devices and NCCL.
Nccl setup_or_skip() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (!all_ranks(err == cudaSuccess && count > 0))
    skip_everywhere(std::string("no CUDA device on some rank (") +
                    (err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0") + ")");
  if (!all_ranks(count >= world_size()))
    skip_everywhere("an NCCL world of " + std::to_string(world_size()) + " ranks needs " +
                    std::to_string(world_size()) + " GPUs (one per rank); this machine shows " +
                    std::to_string(count));
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (!all_ranks(lib != nullptr)) skip_everywhere(std::string("cannot load libnccl.so.2 on some rank"));
  Nccl n;
  n.get_unique_id = reinterpret_cast<decltype(n.get_unique_id)>(dlsym(lib, "ncclGetUniqueId"));
  n.init_rank = reinterpret_cast<decltype(n.init_rank)>(dlsym(lib, "ncclCommInitRank"));
  n.destroy = reinterpret_cast<decltype(n.destroy)>(dlsym(lib, "ncclCommDestroy"));
  n.error_string = reinterpret_cast<decltype(n.error_string)>(dlsym(lib, "ncclGetErrorString"));
  if (!all_ranks(n.get_unique_id && n.init_rank && n.destroy && n.error_string)) {
    std::printf("FAIL: libnccl.so.2 lacks ncclGetUniqueId/ncclCommInitRank/ncclCommDestroy/ncclGetErrorString\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int rank = world_rank();
  std::snprintf(check_prefix, sizeof check_prefix, "rank %d: ", rank);
  const Nccl nccl = setup_or_skip();
  cuda_or_die(cudaSetDevice(rank), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda_or_die(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  ncclUniqueId id;
  if (rank == 0 && nccl.get_unique_id(&id) != ncclSuccess) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t nc = nullptr;
  const ncclResult_t nr = nccl.init_rank(&nc, world_size(), id, rank);
  if (!all_ranks(CHECKF(nr == ncclSuccess, "ncclCommInitRank: %s", nccl.error_string(nr)))) {
    MPI_Finalize();
    return 1;
  }

  dsopt_comm *nccl_comm = nullptr, *mpi_comm = world_comm();
  CHECK_OK(dsopt_comm_create_nccl(&nccl_comm, reinterpret_cast<struct ncclComm*>(nc),
                                  reinterpret_cast<struct CUstream_st*>(stream)));
  if (!all_ranks(nccl_comm != nullptr && mpi_comm != nullptr)) MPI_Abort(MPI_COMM_WORLD, 1);
  CHECK_EQ_INT(dsopt_comm_rank(nccl_comm), rank);
  CHECK_EQ_INT(dsopt_comm_size(nccl_comm), world_size());
  if (rank == 0) std::printf("%s\n", dsopt_build_info());

  struct Variant {
    const char* name;
    int32_t param, grad;
    const char* body;
    bool loss_scaled;
    std::vector<int> inf_steps;
    bool zero = false;  // AdamW under ZeRO-2: no masks, no 1-bit steps
    bool hand_over = false;  // gradients by dsopt_grad_ready on the NCCL side
  };
  const Variant variants[] = {
      {"fp32_wd_clipping", DSOPT_FLOAT32, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
       "\"freeze_step\": 3}}, \"gradient_clipping\": 1.0",
       false, {}},
      {"fp16_loss_scaling", DSOPT_FLOAT16, DSOPT_FLOAT16,
       "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 2e-3, \"freeze_step\": 3}}, "
       "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}",
       true, {6}},
      {"zoadam_fp32_wd_clipping", DSOPT_FLOAT32, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, \"gradient_clipping\": 1.0",
       false, {}},
      {"bf16_params_fp32_grads", DSOPT_BFLOAT16, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 2}}",
       false, {}},
      {"lamb_bf16_params_fp32_grads", DSOPT_BFLOAT16, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
       "\"freeze_step\": 3}}",
       false, {}},
      {"zero2_bf16_params_small_buckets", DSOPT_BFLOAT16, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
       "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, \"allgather_bucket_size\": 30000}",
       false, {}, true},
      {"zero2_fp16_loss_scaling", DSOPT_FLOAT16, DSOPT_FLOAT16,
       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, "
       "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
       "\"zero_optimization\": {\"stage\": 2}",
       true, {6}, true},
      {"zero2_bf16_grad_ready", DSOPT_BFLOAT16, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, "
       "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000}",
       false, {}, true, true},
      {"zero2_compressed_int8_bf16_grad_ready", DSOPT_BFLOAT16, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, "
       "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, "
       "\"compression\": {\"gradients\": \"int8\", \"parameters\": \"int8\"}}",
       false, {}, true, true},
      {"onebit_fp32_grad_ready", DSOPT_FLOAT32, DSOPT_FLOAT32,
       "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 3}}, "
       "\"zero_optimization\": {\"reduce_bucket_size\": 100000}",
       false, {}, false, true},
  };
  uint64_t seed = 200;
  for (const Variant& v : variants) {
    OneBitCase c;
    c.label = std::string("nccl ") + v.name;
    c.body = v.body;
    c.sizes = {1, 7, 77, 4099, 70001, 300001};
    c.param_dtype = v.param;
    c.grad_dtype = v.grad;
    c.loss_scaled = v.loss_scaled;
    c.inf_steps = v.inf_steps;
    c.inf_rank = 1;
    c.masked = v.zero ? std::vector<int>{} : std::vector<int>{2, 4};
    c.clear_mask_step = v.zero ? -1 : 6;
    c.expect_compressed = !v.zero;
    c.hand_over = v.hand_over;
    c.steps = 10;
    c.seed = seed++;
    run_onebit_pair(c, rank, mpi_comm, nccl_comm, stream, replicas_agree(c.label));
  }

  dsopt_comm_destroy(nccl_comm);
  dsopt_comm_destroy(mpi_comm);
  nccl.destroy(nc);
  cudaStreamDestroy(stream);
  return finish_on_every_rank();
}
