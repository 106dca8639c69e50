// libFuzzer target: untrusted JSON configs into dsopt_create.
//
// The input (NUL-terminated copy) is the config of an optimizer over three
// small parameters (fp32, fp16, bf16) on a local communicator. Properties
// (abort() when one fails, so libFuzzer reports it; ASan/UBSan/LSan report
// the rest):
//  - dsopt_create returns DSOPT_OK, DSOPT_EINVAL or DSOPT_EUNSUPPORTED, with
//    a message when it fails, and leaves *out NULL then;
//  - a created optimizer with more than one group is created again with its
//    tensors spread over the groups;
//  - a created optimizer steps (DSOPT_OK or DSOPT_ENONFINITE), saves, loads
//    its own blob and is destroyed.
// "threads" may ask for up to 1024 OpenMP threads: OMP_THREAD_LIMIT caps
// them at 4 here (the library's own cap is tested by tests/c).
//
//   fuzz_config --write-seeds DIR   writes the seed corpus and exits.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dsopt.h"
#include "fuzz_seeds.hpp"

namespace {

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_config: PROPERTY VIOLATED: %s %s\n", what, detail);
  std::abort();
}

struct Model {
  float p0[5] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
  uint16_t p1[4] = {0x3c00, 0xb800, 0x3400, 0x0000};  // fp16 1, -0.5, 0.25, 0
  uint16_t p2[3] = {0x3f80, 0xbf00, 0x3e80};           // bf16 1, -0.5, 0.25
  float g0[5] = {0.01f, 0.02f, -0.03f, 0.04f, -0.05f};
  float g1[4] = {0.5f, -0.25f, 0.125f, 1.0f};
  float g2[3] = {-0.1f, 0.2f, -0.3f};
};

int create(dsopt_optimizer** opt, const char* cfg, dsopt_comm* comm, Model& m, int32_t groups) {
  const dsopt_tensor params[3] = {{m.p0, 5, DSOPT_FLOAT32, 0},
                                  {m.p1, 4, DSOPT_FLOAT16, groups > 1 ? 1 : 0},
                                  {m.p2, 3, DSOPT_BFLOAT16, groups > 2 ? 2 : 0}};
  *opt = reinterpret_cast<dsopt_optimizer*>(&m);  // must come back NULL on failure
  const int rc = dsopt_create(opt, cfg, comm, params, 3);
  if (rc != DSOPT_OK) {
    if (rc != DSOPT_EINVAL && rc != DSOPT_EUNSUPPORTED) {
      std::fprintf(stderr, "dsopt_create returned %d (%s): %s\n", rc, dsopt_status_string(rc),
                   dsopt_last_error());
      die("dsopt_create returned neither DSOPT_OK, DSOPT_EINVAL nor DSOPT_EUNSUPPORTED");
    }
    if (dsopt_last_error()[0] == '\0') die("dsopt_create failed without a message");
    if (*opt != nullptr && *opt != reinterpret_cast<dsopt_optimizer*>(&m)) die("a failed dsopt_create set *out");
    *opt = nullptr;
  }
  return rc;
}

void exercise(dsopt_optimizer* opt, Model& m) {
  const dsopt_tensor grads[3] = {{m.g0, 5, DSOPT_FLOAT32, 0},
                                 {m.g1, 4, DSOPT_FLOAT32, 0},
                                 {m.g2, 3, DSOPT_FLOAT32, 0}};
  for (int k = 0; k < 2; ++k) {
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    const int rc = dsopt_step(opt, grads, 3, &info);
    if (rc != DSOPT_OK && rc != DSOPT_ENONFINITE) {
      std::fprintf(stderr, "dsopt_step returned %d (%s): %s\n", rc, dsopt_status_string(rc),
                   dsopt_last_error());
      die("dsopt_step of a created optimizer failed");
    }
  }
  uint64_t n = 0;
  if (dsopt_state_size(opt, &n) != DSOPT_OK) die("dsopt_state_size failed", dsopt_last_error());
  std::vector<uint8_t> blob(static_cast<size_t>(n));
  if (dsopt_state_save(opt, blob.data(), n, nullptr) != DSOPT_OK) die("dsopt_state_save failed", dsopt_last_error());
  if (dsopt_state_load(opt, blob.data(), n) != DSOPT_OK) die("dsopt_state_load of its own blob failed", dsopt_last_error());
  double scale = 0;
  if (dsopt_get_loss_scale(opt, &scale) != DSOPT_OK) die("dsopt_get_loss_scale failed");
}

const char* const kSeeds[][2] = {
    // Valid: every key of docs/reference/config.md, per optimizer.
    {"adam_minimal", R"({"optimizer": {"type": "Adam"}})"},
    {"adamw_all_keys", R"({"device": "cpu", "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "bias_correction": true, "adam_w_mode": true, "amsgrad": false, "comm_backend_name": "nccl", "cuda_aware": false}}, "gradient_clipping": 1.0, "skip_nonfinite": true, "max_consecutive_skips": 50, "report_grad_norm": true, "threads": 1, "cuda_aware": false, "train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "steps_per_print": 10, "wall_clock_breakdown": false})"},
    {"adam_l2_groups", R"({"optimizer": {"type": "adam", "params": {"lr": 0.01, "weight_decay": 0.1, "adam_w_mode": false, "bias_correction": false}}, "param_groups": [{"lr": 0.02}, {"betas": [0.8, 0.99], "eps": 1e-4, "weight_decay": 0}, {"lr": 0}]})"},
    {"fp16_dynamic", R"({"optimizer": {"type": "AdamW"}, "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2, "consecutive_hysteresis": false, "min_loss_scale": 1}})"},
    {"fp16_static", R"({"optimizer": {"type": "AdamW"}, "fp16": {"enabled": true, "loss_scale": 128.0}, "skip_nonfinite": false})"},
    {"bf16", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}, "bf16": {"enabled": true}})"},
    {"zero2_all_keys", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e7, "allgather_bucket_size": 5e7, "reduce_scatter": true, "contiguous_gradients": true, "round_robin_gradients": false, "offload_optimizer": {"device": "none", "pin_memory": false, "buffer_count": 4, "fast_init": false, "ratio": 1.0}, "overlap_comm": true, "allgather_partitions": true, "use_multi_rank_bucket_allreduce": true, "elastic_checkpoint": false, "load_from_fp32_weights": true, "ignore_unused_parameters": true}})"},
    {"zero1_small_buckets", R"({"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 1, "reduce_bucket_size": 4, "allgather_bucket_size": 3, "reduce_scatter": false}})"},
    {"onebit_adam", R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0, "freeze_step": 1, "bias_correction": false, "eps_inside_sqrt": false, "amsgrad": false, "stabilize": true, "stabilize_limit": 1.0, "comm_backend_name": "mpi", "cuda_aware": false}}, "param_groups": [{"non_freeze": true}, {"lr": 0.002}]})"},
    {"onebit_lamb", R"({"optimizer": {"type": "OneBitLamb", "params": {"lr": 0.001, "freeze_step": 1, "max_coeff": 10.0, "min_coeff": 0.01, "coeff_beta": 0.9, "factor_max": 4.0, "factor_min": 0.5, "factor_threshold": 0.1, "stabilize": false}}, "fp16": {"enabled": true, "initial_scale_power": 8}})"},
    {"zero_one_adam", R"({"optimizer": {"type": "ZeroOneAdam", "params": {"lr": 0.001, "var_freeze_step": 1, "var_update_scaler": 16, "local_step_scaler": 32678, "local_step_clipper": 16, "decoupled_sync_weight_decay": true, "stabilize_limit": 4}}})"},
    // Invalid: one mistake each.
    {"bad_unknown_key", R"({"optimizer": {"type": "AdamW", "params": {"freze_step": 3}}})"},
    {"bad_type", R"({"optimizer": {"type": "SGD"}})"},
    {"bad_type_not_string", R"({"optimizer": {"type": 7}})"},
    {"bad_missing_optimizer", R"({"fp16": {"enabled": true}})"},
    {"bad_lr_string", R"({"optimizer": {"type": "AdamW", "params": {"lr": "0.1"}}})"},
    {"bad_lr_huge", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e400}}})"},
    {"bad_lr_negative", R"({"optimizer": {"type": "AdamW", "params": {"lr": -1}}})"},
    {"bad_eps_tiny", R"({"optimizer": {"type": "AdamW", "params": {"eps": 1e-50}}})"},
    {"bad_betas", R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})"},
    {"bad_betas_shape", R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})"},
    {"bad_amsgrad", R"({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}})"},
    {"bad_adamw_l2", R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})"},
    {"bad_groups_empty", R"({"optimizer": {"type": "AdamW"}, "param_groups": []})"},
    {"bad_fp16_bf16", R"({"optimizer": {"type": "AdamW"}, "fp16": {"enabled": true}, "bf16": {"enabled": true}})"},
    {"bad_scale_power", R"({"optimizer": {"type": "AdamW"}, "fp16": {"enabled": true, "initial_scale_power": 1e19}})"},
    {"bad_threads", R"({"optimizer": {"type": "AdamW"}, "threads": 4096})"},
    {"bad_threads_float", R"({"optimizer": {"type": "AdamW"}, "threads": 1.5})"},
    {"bad_skips_negative", R"({"optimizer": {"type": "AdamW"}, "max_consecutive_skips": -1})"},
    {"bad_zero3", R"({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}})"},
    {"bad_zero_onebit", R"({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 2}})"},
    {"offload_cpu", R"({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})"},
    {"bad_offload_nvme", R"({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})"},
    {"bad_device_cuda", R"({"device": "cuda", "optimizer": {"type": "AdamW"}})"},
    {"bad_device", R"({"device": "tpu", "optimizer": {"type": "AdamW"}})"},
    {"bad_duplicate_keys", R"({"optimizer": {"type": "AdamW"}, "optimizer": {"type": "Adam", "params": {"lr": 0.1, "lr": -1}}})"},
    {"bad_max_grad_norm", R"({"optimizer": {"type": "OneBitLamb", "params": {"max_grad_norm": 1.0}}})"},
    {"bad_lamb_coeffs", R"({"optimizer": {"type": "OneBitLamb", "params": {"min_coeff": 2, "max_coeff": 1}}})"},
    {"bad_freeze_step", R"({"optimizer": {"type": "OneBitAdam", "params": {"freeze_step": 0}}})"},
    {"bad_top_level_array", R"([{"optimizer": {"type": "AdamW"}}])"},
    {"bad_not_json", R"({"optimizer": {"type": "AdamW",})"},
    {"bad_nested_ignored", R"({"optimizer": {"type": "AdamW"}, "train_batch_size": [[[[[[[[{"a": [[[[1]]]]}]]]]]]]]})"},
    {"bad_utf8", "{\"optimizer\": {\"type\": \"Adam\xff\xfe\"}}"},
    {"bad_utf8_key", "{\"optimizer\": {\"type\": \"AdamW\"}, \"\xc3\x28\": 1}"},
};

void write_seeds(const std::string& dir) {
  mkdir(dir.c_str(), 0755);
  int n = 0;
  for (const auto& s : kSeeds) {
    const std::string path = dir + "/" + s[0] + ".json";
    FILE* f = std::fopen(path.c_str(), "wb");
    const size_t len = std::strlen(s[1]);
    if (!f || std::fwrite(s[1], 1, len, f) != len || std::fclose(f) != 0) die("cannot write", path.c_str());
    ++n;
  }
  std::fprintf(stderr, "fuzz_config: wrote %d seeds to %s\n", n, dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("OMP_THREAD_LIMIT", "4", 0);
  setenv("OMP_WAIT_POLICY", "passive", 0);
  write_seeds_if_asked(*argc, *argv, write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static dsopt_comm* comm = [] {
    dsopt_comm* c = nullptr;
    if (dsopt_comm_create_local(&c) != DSOPT_OK) die("dsopt_comm_create_local failed");
    return c;
  }();
  const std::string cfg(reinterpret_cast<const char*>(data), size);  // NUL-terminated copy
  Model m;
  dsopt_optimizer* opt = nullptr;
  if (create(&opt, cfg.c_str(), comm, m, 1) != DSOPT_OK) return 0;
  int32_t groups = 0;
  if (dsopt_num_groups(opt, &groups) != DSOPT_OK || groups < 1) die("dsopt_num_groups failed");
  exercise(opt, m);
  dsopt_destroy(opt);
  if (groups > 1) {
    Model m2;
    if (create(&opt, cfg.c_str(), comm, m2, groups) != DSOPT_OK) die("creation with more groups failed", dsopt_last_error());
    exercise(opt, m2);
    dsopt_destroy(opt);
  }
  return 0;
}
