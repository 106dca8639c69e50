// 1-bit Adam, 1-bit LAMB and 0/1 Adam with "device": "cuda" give the same bits as "device": "cpu" on
// one rank (where the compressed allreduce is the identity, docs/design/decisions.md C5):
// the warmup rule, the compression-stage rules (momentum, then the
// parameter from the frozen v) and the momentum masks (a device buffer for
// the CUDA optimizer, a host buffer for the CPU one; one mask cleared
// midway), for every parameter x gradient dtype, with clipping, fp16 loss
// scaling with overflowing steps in both stages, and a non_freeze group;
// each on the stabilized compression stage (the default, one config with
// another stabilize_limit) and on DeepSpeed's ("stabilize": false).
// Parameters and step info after every step, the state blobs and a resume
// of each blob on the other device must be bit-identical. Also: masks on
// the wrong device are rejected (is_cuda_device_pointer), pinned host
// memory counts as host memory.
// Skips (exit code 77) on machines without a CUDA device.
#include <string>
#include <vector>

#include "onebit_pair.hpp"

using namespace gpu_test;

namespace {

const int32_t kDtypes[] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};

struct Config {
  const char* name;
  const char* body;
  int groups;
  bool loss_scaled;
  std::vector<int> inf_steps;
  std::vector<int> masked;
  int clear_mask_step;
  int steps;
};

const Config kConfigs[] = {
    {"onebit_wd_clipping",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 4}}, \"gradient_clipping\": 1.0",
     1, false, {}, {2, 4}, 7, 10},
    {"onebit_fp16_loss_scaling",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, 0.99], "
     "\"eps\": 1e-6, \"freeze_step\": 3, \"stabilize_limit\": 0.5}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"gradient_clipping\": 0.5",
     1, true, {1, 6}, {3}, -1, 10},
    {"onebit_non_freeze_group",
     "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 2}}, "
     "\"param_groups\": [{\"weight_decay\": 0.05}, {\"lr\": 5e-4, \"non_freeze\": true}], "
     "\"report_grad_norm\": true",
     2, false, {}, {2, 4}, 5, 8},
    // 1-bit LAMB: trust ratios from the per-tensor norms, the fused buffer,
    // vf and the factor from the per-tensor maximum
    {"lamb_wd_clipping",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, "
     "\"freeze_step\": 4}}, \"gradient_clipping\": 1.0",
     1, false, {}, {2, 4}, 7, 10},
    {"lamb_fp16_loss_scaling",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, 0.99], "
     "\"eps\": 1e-6, \"freeze_step\": 3, \"stabilize_limit\": 0.5, \"max_coeff\": 0.3}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"gradient_clipping\": 0.5",
     1, true, {1, 6}, {3}, -1, 10},
    {"lamb_two_groups",
     "\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 2}}, "
     "\"param_groups\": [{\"weight_decay\": 0.05}, {\"lr\": 5e-4}], \"report_grad_norm\": true",
     2, false, {}, {2, 4}, 5, 8},
    // 0/1 Adam: full, 1-bit, local and sync steps (k = 2, 3, 4 full, 5 1-bit,
    // 6 full, then syncs at 7, 8, 10, 12, 16 and local steps between)
    {"zoadam_wd_clipping",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, \"gradient_clipping\": 1.0",
     1, false, {}, {2, 4}, 9, 16},
    {"zoadam_decoupled_fp16_loss_scaling",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, 0.99], "
     "\"eps\": 1e-6, \"weight_decay\": 0.02, \"decoupled_sync_weight_decay\": true, \"stabilize_limit\": 0.5, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}",
     1, true, {1, 9}, {3}, -1, 16},
    {"zoadam_two_groups",
     "\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": 1e-3, \"var_freeze_step\": 5, \"var_update_scaler\": 2, \"local_step_scaler\": 2, \"local_step_clipper\": 4}}, "
     "\"param_groups\": [{\"weight_decay\": 0.05}, {\"lr\": 5e-4}], \"report_grad_norm\": true",
     2, false, {}, {2, 4}, 5, 14},
};

// The config on DeepSpeed's compression stage: "stabilize": false added to its params.
std::string deepspeed_rule(const std::string& body) {
  const std::string params = "\"params\": {";
  std::string out = body;
  out.insert(out.find(params) + params.size(), "\"stabilize\": false, ");
  return out;
}

// Masks must be on the optimizer's device; pinned host memory is host memory.
void masks_on_the_wrong_device_are_rejected(dsopt_comm* comm) {
  check_current_test = "masks_on_the_wrong_device_are_rejected";
  const int64_t n = 1000;
  TensorSet cpu_params, cuda_params;
  rng r = rng_for(99, 0, 0);
  const std::vector<uint8_t> bytes = random_bytes(&r, n, DSOPT_FLOAT32, 0.5);
  cpu_params.add(n, DSOPT_FLOAT32, 0, bytes);
  cuda_params.add(n, DSOPT_FLOAT32, 0, bytes);
  const char* body = "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"freeze_step\": 2}}";
  const std::string cfg_cpu = with_device(body, "cpu"), cfg_cuda = with_device(body, "cuda");
  std::vector<dsopt_tensor> ph = cpu_params.host_tensors(), pd = cuda_params.device_tensors();
  dsopt_optimizer *cpu = nullptr, *cuda = nullptr;
  if (CHECK_OK(dsopt_create(&cpu, cfg_cpu.c_str(), comm, ph.data(), 1)) &&
      CHECK_OK(dsopt_create(&cuda, cfg_cuda.c_str(), comm, pd.data(), 1))) {
    TensorSet mask;
    mask.add(n, DSOPT_FLOAT32, 0, mask_bytes(n, 0));
    dsopt_tensor host = mask.host_tensors()[0], device = mask.device_tensors()[0];
    CHECK_STATUS(dsopt_set_momentum_mask(cuda, 0, &host), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("device");
    CHECK_STATUS(dsopt_set_momentum_mask(cpu, 0, &device), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("device");
    CHECK_OK(dsopt_set_momentum_mask(cpu, 0, &host));
    CHECK_OK(dsopt_set_momentum_mask(cuda, 0, &device));

    void* pinned = nullptr;
    cuda_or_die(cudaMallocHost(&pinned, size_t(n) * 4), "cudaMallocHost");
    std::memcpy(pinned, mask.host[0].data(), size_t(n) * 4);
    dsopt_tensor pinned_mask = {pinned, n, DSOPT_FLOAT32, 0};
    CHECK_OK(dsopt_set_momentum_mask(cpu, 0, &pinned_mask));
    CHECK_STATUS(dsopt_set_momentum_mask(cuda, 0, &pinned_mask), DSOPT_EINVAL);
    cudaFreeHost(pinned);
  }
  dsopt_destroy(cuda);
  dsopt_destroy(cpu);
  check_current_test = "";
}

}  // namespace

int main() {
  skip_without_device();
  dsopt_comm* comm = nullptr;
  if (!CHECK_OK(dsopt_comm_create_local(&comm))) return check_finish();
  std::printf("%s\n", dsopt_build_info());

  masks_on_the_wrong_device_are_rejected(comm);
  uint64_t seed = 1;
  for (const Config& cfg : kConfigs)
    for (bool stabilize : {true, false})
      for (int32_t p : kDtypes)
        for (int32_t g : kDtypes) {
          OneBitCase c;
          c.label = std::string(cfg.name) + (stabilize ? " stabilized" : " deepspeed") +
                    " param=" + dtype_label(p) + " grad=" + dtype_label(g);
          c.body = stabilize ? std::string(cfg.body) : deepspeed_rule(cfg.body);
          c.groups = cfg.groups;
          c.sizes = {1, 7, 4097, 65537, 300001};
          c.param_dtype = p;
          c.grad_dtype = g;
          c.loss_scaled = cfg.loss_scaled;
          c.inf_steps = cfg.inf_steps;
          c.masked = cfg.masked;
          c.clear_mask_step = cfg.clear_mask_step;
          c.steps = cfg.steps;
          c.seed = seed++;
          run_onebit_pair(c, 0, comm, comm, nullptr, nullptr);
        }

  dsopt_comm_destroy(comm);
  return check_finish();
}
