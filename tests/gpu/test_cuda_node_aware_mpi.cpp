// The node-aware compressed collectives on device buffers (mpirun -np 4,
// every rank on GPU 0, declared as 2 nodes of 2 ranks: "topology":
// {"hierarchy": "node_aware", "ranks_per_node": 2}): 1-bit Adam, 1-bit
// LAMB and 0/1 Adam with either node step, and compressed ZeRO, each as a
// CPU optimizer on host buffers and a CUDA optimizer on device buffers
// (MPI staging through pinned memory) over MPI_COMM_WORLD, stepped with the
// same gradients across the warmup/compression boundary: parameters, step
// info (bytes sent and bytes to other nodes included) and state blobs
// bit-identical between the devices, each blob resumed on the other device.
// The gradients lie on a grid whose sums are exact (OneBitCase::exact_grads):
// the warmup's allreduce of device buffers runs in MPI's order, the host
// one in dsopt's. tests/internal/test_onebit_node_aware_device.cpp checks
// the same on a stand-in device without a GPU.
// Skips (exit code 77, on every rank) without a CUDA device.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <string>
#include <vector>

#include "gpu_mpi.hpp"
#include "onebit_pair.hpp"

extern "C" {
#include "support/mpi_world.h"
}

using namespace gpu_test;

namespace {

struct Config {
  const char* name;
  const char* body;
  int steps;
  bool compresses;  // false: compressed ZeRO (no 1-bit steps)
};

#define NODES "\"topology\": {\"hierarchy\": \"node_aware\", \"ranks_per_node\": 2"
const Config kConfigs[] = {
    {"onebit_adam_fp32_node_step",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 3}}, \"gradient_clipping\": 1.0, " NODES "}",
     8, true},
    {"onebit_adam_1bit_node_step",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 3}}, " NODES
     ", \"node_reduce\": \"1bit\"}",
     8, true},
    {"onebit_lamb_fp32_node_step",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 3}}, " NODES "}",
     8, true},
    {"onebit_lamb_1bit_node_step",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 3}}, " NODES
     ", \"node_reduce\": \"1bit\"}",
     8, true},
    {"zoadam_fp32_node_step",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"var_freeze_step\": 3, "
     "\"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, " NODES "}",
     12, true},
    {"zoadam_1bit_node_step",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"var_freeze_step\": 3, "
     "\"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, " NODES
     ", \"node_reduce\": \"1bit\"}",
     12, true},
    {"zero2_compressed_int4_int8",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
     "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, \"allgather_bucket_size\": 30000, "
     "\"compression\": {\"gradients\": \"int4\", \"parameters\": \"int8\"}}, " NODES "}",
     6, false},
    {"zero1_compressed_sign_bf16",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}, "
     "\"zero_optimization\": {\"stage\": 1, \"compression\": {\"gradients\": \"sign\", \"parameters\": \"bf16\"}}, "
     NODES "}",
     6, false},
};
#undef NODES

}  // namespace

int main(int argc, char** argv) {
  dsopt_comm* comm = start_on_gpu0(&argc, &argv, 4);
  if (comm == nullptr) return check_finish();
  const int rank = world_rank();

  uint64_t seed = 500;
  for (const Config& cfg : kConfigs)
    for (int32_t p : {DSOPT_FLOAT32, DSOPT_BFLOAT16}) {
      OneBitCase c;
      c.label = std::string(cfg.name) + " param=" + dtype_label(p);
      c.body = cfg.body;
      c.sizes = {1, 7, 77, 4099, 70001, 300001};
      c.param_dtype = p;
      c.steps = cfg.steps;
      c.seed = seed++;
      c.expect_compressed = cfg.compresses;
      c.exact_grads = true;
      bool across = false;
      const auto agree = replicas_agree(c.label);
      run_onebit_pair(c, rank, comm, comm, nullptr, [&](TensorSet& cpu_params, int step, int phase) {
        across |= phase == DSOPT_PHASE_COMPRESSED || phase == DSOPT_PHASE_SYNC || !cfg.compresses;
        agree(cpu_params, step, phase);
      });
      CHECKF(across, "%s: some step ran the node-aware exchange", c.label.c_str());
    }

  dsopt_comm_destroy(comm);
  return finish_on_every_rank();
}
