// 1-bit Adam and 1-bit LAMB on 2 MPI ranks (mpirun -np 2, both ranks on GPU 0): every rank
// runs a CPU optimizer on host buffers and a CUDA optimizer on device
// buffers (MPI staging through pinned memory) over MPI_COMM_WORLD with its
// own gradients, across the warmup/compression boundary, so the compressed
// allreduce runs on both backends: parameters and step info after every
// step, and the state blobs (moments and the compression errors) must be
// bit-identical between the devices on each rank, the parameters identical
// on every rank, and each blob must resume on the other device.
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

const int32_t kDtypes[] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};

struct Config {
  const char* name;
  const char* body;
  int groups;
  bool loss_scaled;
  std::vector<int> inf_steps;  // on rank 1
  std::vector<int> masked;
  int clear_mask_step;
  int steps;
  bool compresses = true;  // false: AdamW under ZeRO (no masks, no 1-bit steps)
};

const Config kConfigs[] = {
    {"onebit_wd_clipping_masks",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 3}}, \"gradient_clipping\": 1.0",
     1, false, {}, {2, 4}, 7, 10},
    {"onebit_fp16_loss_scaling_overflow_on_one_rank",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, 0.99], "
     "\"eps\": 1e-6, \"freeze_step\": 3}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}",
     1, true, {1, 6}, {3}, -1, 10},
    {"onebit_non_freeze_group",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 2}}, "
     "\"param_groups\": [{\"weight_decay\": 0.05}, {\"lr\": 5e-4, \"non_freeze\": true}], "
     "\"report_grad_norm\": true",
     2, false, {}, {2, 4}, 5, 8},
    {"lamb_wd_two_groups_masks",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 3}}, \"param_groups\": [{}, {\"lr\": 5e-4}], \"gradient_clipping\": 1.0",
     2, false, {}, {2, 4}, 7, 10},
    {"zoadam_wd_clipping_masks",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, \"gradient_clipping\": 1.0",
     1, false, {}, {2, 4}, 9, 16},
    {"zoadam_fp16_overflow_on_one_rank",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 2e-3, \"weight_decay\": 0.02, "
     "\"decoupled_sync_weight_decay\": true, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}",
     1, true, {1, 9}, {3}, -1, 16},
    // ZeRO stage 2: reduce-scatter and allgather of device buffers staged
    // through pinned memory, buckets smaller than a tensor.
    {"zero2_wd_clipping_two_groups",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
     "\"param_groups\": [{}, {\"lr\": 5e-4}], \"gradient_clipping\": 1.0, "
     "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, \"allgather_bucket_size\": 30000}",
     2, false, {}, {}, -1, 8, false},
    {"zero1_fp16_overflow_on_one_rank",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"zero_optimization\": {\"stage\": 1}",
     1, true, {1, 6}, {}, -1, 8, false},
    // Compressed ZeRO: the codec kernels on the device, the residual
    // rescaled across loss-scale changes and kept through skipped steps.
    {"zero2_compressed_int4_int8",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
     "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, \"allgather_bucket_size\": 30000, "
     "\"compression\": {\"gradients\": \"int4\", \"parameters\": \"int8\"}}",
     1, false, {}, {}, -1, 8, false},
    {"zero1_compressed_sign_fp16_overflow_on_one_rank",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"zero_optimization\": {\"stage\": 1, \"compression\": {\"gradients\": \"sign\", \"parameters\": \"bf16\"}}",
     1, true, {1, 6}, {}, -1, 8, false},
    // ZeRO-Offload: the CUDA optimizer keeps masters and moments on the host
    // (the CPU optimizer ignores the key), several upload tiles per shard.
    {"zero2_offload_pinned_clipping",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
     "\"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, "
     "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
     1, false, {}, {}, -1, 6, false},
    {"zero1_offload_fp16_overflow_on_one_rank",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}",
     1, true, {1, 4}, {}, -1, 6, false},
};


}  // namespace

int main(int argc, char** argv) {
  dsopt_comm* comm = start_on_gpu0(&argc, &argv, 2);
  if (comm == nullptr) return check_finish();
  const int rank = world_rank();

  uint64_t seed = 100;
  for (const Config& cfg : kConfigs)
    for (int32_t p : kDtypes)
      for (int32_t g : kDtypes) {
        OneBitCase c;
        c.label = std::string(cfg.name) + " param=" + dtype_label(p) + " grad=" + dtype_label(g);
        c.body = cfg.body;
        c.groups = cfg.groups;
        c.sizes = {1, 7, 77, 4099, 70001, 300001};
        c.param_dtype = p;
        c.grad_dtype = g;
        c.loss_scaled = cfg.loss_scaled;
        c.inf_steps = cfg.inf_steps;
        c.inf_rank = 1;
        c.masked = cfg.masked;
        c.clear_mask_step = cfg.clear_mask_step;
        c.steps = cfg.steps;
        c.seed = seed++;
        c.expect_compressed = cfg.compresses;
        run_onebit_pair(c, rank, comm, comm, nullptr, replicas_agree(c.label));
      }

  dsopt_comm_destroy(comm);
  return finish_on_every_rank();
}
