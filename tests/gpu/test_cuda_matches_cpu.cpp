// "device": "cuda" gives the same bits as "device": "cpu" (docs/optimizers/adam.md, "What
// one step computes": CPU vector code, CPU scalar code and the CUDA kernel
// run the same function). For every parameter dtype x gradient dtype, odd
// tensor sizes in one optimizer and several configs (AdamW with clipping,
// Adam-L2 with fp16 loss scaling, parameter groups, no checks at all, Lion), the
// same random gradients go through a CPU optimizer on host buffers and a
// CUDA optimizer on device buffers: parameters after every step, the step
// info and the state blobs must be bit-identical, and a blob saved on one
// device must load on the other and continue identically.
// Skips (exit code 77) on machines without a CUDA device.
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test.hpp"

using namespace gpu_test;

namespace {

const int64_t kSizes[] = {1, 7, 4097, 65537, 1000003};
const int32_t kDtypes[] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};
constexpr int kSteps = 10;

struct Config {
  const char* name;
  const char* body;     // the config without "device"
  int groups;           // tensor i goes to group i % groups
  bool loss_scaled;     // gradients are multiplied by the loss scale
  int inf_step;         // step whose gradients hold an Inf (-1: none)
};

const Config kConfigs[] = {
    {"adamw_clipping",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
     "\"gradient_clipping\": 1.0",
     1, false, 6},
    {"adam_l2_fp16_loss_scaling",
     "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 2e-3, \"betas\": [0.8, 0.99], "
     "\"eps\": 1e-6, \"weight_decay\": 0.05, \"adam_w_mode\": false}}, "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"gradient_clipping\": 0.5",
     1, true, 4},
    {"param_groups_no_bias_correction",
     "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"bias_correction\": false}}, "
     "\"param_groups\": [{\"lr\": 1e-3, \"weight_decay\": 0.1}, "
     "{\"lr\": 5e-4, \"betas\": [0.85, 0.995], \"eps\": 1e-7}], \"report_grad_norm\": true",
     2, false, -1},
    {"adam_unchecked_gradients",
     "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1e-2}}, \"skip_nonfinite\": false",
     1, false, -1},    {"lion_fp16_loss_scaling_groups",
     "\"optimizer\": {\"type\": \"Lion\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}}, "
     "\"param_groups\": [{}, {\"lr\": 5e-4, \"betas\": [0.85, 0.95], \"weight_decay\": 0.0}], "
     "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, \"loss_scale_window\": 3}, "
     "\"gradient_clipping\": 0.5",
     2, true, 4},
    {"sgd_nesterov_and_dampening_groups",
     "\"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1e-2, \"momentum\": 0.9, "
     "\"dampening\": 0.1, \"weight_decay\": 0.01}}, "
     "\"param_groups\": [{}, {\"lr\": 5e-3, \"dampening\": 0, \"nesterov\": true}]",
     2, false, -1},
};

struct Case {
  const Config* cfg;
  int32_t param_dtype, grad_dtype;
  std::string label;
};

// Params of a CPU optimizer (host bytes) against those of a CUDA one.
bool params_match(const Case& c, const char* when, TensorSet& cpu, TensorSet& cuda) {
  bool all = true;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const std::vector<uint8_t> dev = cuda.device[i].to_host();
    const int64_t at = first_difference(cpu.host[i], dev);
    all &= CHECKF(at < 0, "%s %s: tensor %zu (numel %lld) differs at byte %lld", c.label.c_str(),
                  when, i, (long long)cpu.numel[i], (long long)at) != 0;
  }
  return all;
}

bool info_match(const Case& c, int step, const dsopt_step_info& a, const dsopt_step_info& b) {
  bool ok = true;
  ok &= CHECKF(a.skipped == b.skipped, "%s step %d: skipped cpu %d cuda %d", c.label.c_str(), step,
               a.skipped, b.skipped) != 0;
  ok &= CHECKF(a.step == b.step, "%s step %d: step cpu %lld cuda %lld", c.label.c_str(), step,
               (long long)a.step, (long long)b.step) != 0;
  ok &= CHECKF(bits_of(a.loss_scale) == bits_of(b.loss_scale), "%s step %d: loss_scale %.17g vs %.17g",
               c.label.c_str(), step, a.loss_scale, b.loss_scale) != 0;
  ok &= CHECKF(same_double(a.grad_norm, b.grad_norm), "%s step %d: grad_norm cpu %.17g cuda %.17g",
               c.label.c_str(), step, a.grad_norm, b.grad_norm) != 0;
  return ok;
}

// Gradients for one step, in host memory and on the device.
TensorSet make_grads(const Case& c, rng* r, double loss_scale, int step) {
  TensorSet g;
  for (size_t i = 0; i < sizeof kSizes / sizeof kSizes[0]; ++i) {
    const double scale = 0.01 * (c.cfg->loss_scaled ? loss_scale : 1.0);
    std::vector<uint8_t> bytes = random_bytes(r, kSizes[i], c.grad_dtype, scale);
    if (step == c.cfg->inf_step && i == 3) element_set(bytes.data(), c.grad_dtype, 17, INFINITY);
    g.add(kSizes[i], c.grad_dtype, 0, std::move(bytes));
  }
  return g;
}

dsopt_step_info new_info() {
  dsopt_step_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  return info;
}

// One more step of a CPU and a CUDA optimizer with the same gradients.
void step_both(const Case& c, dsopt_optimizer* cpu, dsopt_optimizer* cuda, TensorSet& grads,
               int step) {
  std::vector<dsopt_tensor> gh = grads.host_tensors(), gd = grads.device_tensors();
  dsopt_step_info a = new_info(), b = new_info();
  CHECK_OK(dsopt_step(cpu, gh.data(), int64_t(gh.size()), &a));
  CHECK_OK(dsopt_step(cuda, gd.data(), int64_t(gd.size()), &b));
  info_match(c, step, a, b);
}

void run_case(const Case& c, dsopt_comm* comm) {
  check_current_test = c.label.c_str();
  const int failed_before = check_failed_count;
  rng r = rng_for(uint64_t(&c.cfg[0] - &kConfigs[0]) + 1, uint64_t(c.param_dtype),
                  uint64_t(c.grad_dtype));

  TensorSet cpu_params, cuda_params;
  for (size_t i = 0; i < sizeof kSizes / sizeof kSizes[0]; ++i) {
    std::vector<uint8_t> bytes = random_bytes(&r, kSizes[i], c.param_dtype, 0.5);
    const int32_t group = int32_t(i) % c.cfg->groups;
    cpu_params.add(kSizes[i], c.param_dtype, group, bytes);
    cuda_params.add(kSizes[i], c.param_dtype, group, bytes);
  }
  const std::string cfg_cpu = with_device(c.cfg->body, "cpu");
  const std::string cfg_cuda = with_device(c.cfg->body, "cuda");

  dsopt_optimizer *cpu = nullptr, *cuda = nullptr;
  std::vector<dsopt_tensor> ph = cpu_params.host_tensors(), pd = cuda_params.device_tensors();
  const int rc_cpu = dsopt_create(&cpu, cfg_cpu.c_str(), comm, ph.data(), int64_t(ph.size()));
  const int rc_cuda = dsopt_create(&cuda, cfg_cuda.c_str(), comm, pd.data(), int64_t(pd.size()));
  if (rc_cpu != DSOPT_OK) {
    // A combination the library rejects must be rejected the same way on both.
    CHECKF(rc_cuda == rc_cpu, "%s: create cpu %d, cuda %d", c.label.c_str(), rc_cpu, rc_cuda);
    check_skip(c.label.c_str(), dsopt_last_error());
    dsopt_destroy(cuda);
    return;
  }
  if (!CHECK_OK(rc_cuda)) {
    dsopt_destroy(cpu);
    return;
  }

  for (int s = 0; s < kSteps; ++s) {
    double scale_cpu = 0, scale_cuda = 0;
    CHECK_OK(dsopt_get_loss_scale(cpu, &scale_cpu));
    CHECK_OK(dsopt_get_loss_scale(cuda, &scale_cuda));
    CHECKF(scale_cpu == scale_cuda, "%s step %d: loss scales %g vs %g", c.label.c_str(), s,
           scale_cpu, scale_cuda);
    TensorSet grads = make_grads(c, &r, scale_cpu, s);
    step_both(c, cpu, cuda, grads, s);
    const std::string when = "after step " + std::to_string(s);
    if (!params_match(c, when.c_str(), cpu_params, cuda_params)) break;
  }

  const std::vector<uint8_t> blob_cpu = save_state(cpu), blob_cuda = save_state(cuda);
  CHECKF(!blob_cpu.empty() && first_difference(blob_cpu, blob_cuda) < 0,
         "%s: state blobs (%zu and %zu bytes) differ at byte %lld", c.label.c_str(),
         blob_cpu.size(), blob_cuda.size(), (long long)first_difference(blob_cpu, blob_cuda));

  // Cross-device resume: a CPU optimizer loads the CUDA blob and a CUDA
  // optimizer the CPU blob, each starting from the other's parameters (the
  // caller restores its own parameters; dsopt restores the rest).
  TensorSet cpu2_params, cuda2_params;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    cpu2_params.add(cpu_params.numel[i], c.param_dtype, cpu_params.group[i],
                    cuda_params.device[i].to_host());
    cuda2_params.add(cpu_params.numel[i], c.param_dtype, cpu_params.group[i], cpu_params.host[i]);
  }
  dsopt_optimizer *cpu2 = nullptr, *cuda2 = nullptr;
  std::vector<dsopt_tensor> ph2 = cpu2_params.host_tensors(), pd2 = cuda2_params.device_tensors();
  if (CHECK_OK(dsopt_create(&cpu2, cfg_cpu.c_str(), comm, ph2.data(), int64_t(ph2.size()))) &&
      CHECK_OK(dsopt_create(&cuda2, cfg_cuda.c_str(), comm, pd2.data(), int64_t(pd2.size())))) {
    CHECK_OK(dsopt_state_load(cpu2, blob_cuda.data(), blob_cuda.size()));
    CHECK_OK(dsopt_state_load(cuda2, blob_cpu.data(), blob_cpu.size()));
    CHECKF(first_difference(save_state(cpu2), blob_cuda) < 0,
           "%s: CPU optimizer that loaded the CUDA blob saves it back unchanged", c.label.c_str());
    CHECKF(first_difference(save_state(cuda2), blob_cpu) < 0,
           "%s: CUDA optimizer that loaded the CPU blob saves it back unchanged", c.label.c_str());
    params_match(c, "after loading the other device's blob", cpu2_params, cuda_params);
    params_match(c, "after loading the other device's blob", cpu_params, cuda2_params);

    double scale = 0;
    CHECK_OK(dsopt_get_loss_scale(cpu2, &scale));
    TensorSet grads = make_grads(c, &r, scale, kSteps);
    step_both(c, cpu, cuda2, grads, kSteps);
    step_both(c, cpu2, cuda, grads, kSteps);
    params_match(c, "one step after resuming on the other device (cpu, cuda2)", cpu_params,
                 cuda2_params);
    params_match(c, "one step after resuming on the other device (cpu2, cuda)", cpu2_params,
                 cuda_params);
    params_match(c, "one step after resuming (cpu, cuda)", cpu_params, cuda_params);
  }
  dsopt_destroy(cpu2);
  dsopt_destroy(cuda2);
  dsopt_destroy(cpu);
  dsopt_destroy(cuda);
  std::printf("%s %s\n", check_failed_count == failed_before ? "ok  " : "FAIL", c.label.c_str());
  std::fflush(stdout);
}

// Parameters or gradients on the wrong device are refused with
// DSOPT_EINVAL naming the buffer and both devices, and change nothing: the
// optimizer steps as before with the right buffers.
void buffers_on_the_wrong_device_are_rejected(dsopt_comm* comm) {
  check_current_test = "buffers_on_the_wrong_device_are_rejected";
  rng r = {7};
  const int64_t n = 4097;
  TensorSet params, grads, other;
  params.add(n, DSOPT_FLOAT32, 0, random_bytes(&r, n, DSOPT_FLOAT32, 1.0));
  grads.add(n, DSOPT_FLOAT32, 0, random_bytes(&r, n, DSOPT_FLOAT32, 0.1));
  const std::string body =
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}";
  const std::string cfg_cpu = "{" + body + "}", cfg_cuda = "{" + body + ", \"device\": \"cuda\"}";
  std::vector<dsopt_tensor> ph = params.host_tensors(), pd = params.device_tensors();
  std::vector<dsopt_tensor> gh = grads.host_tensors(), gd = grads.device_tensors();
  dsopt_optimizer* bad = nullptr;
  CHECK_STATUS(dsopt_create(&bad, cfg_cuda.c_str(), comm, ph.data(), 1), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params[0].data is host memory but the optimizer's device is cuda:");
  CHECK_STATUS(dsopt_create(&bad, cfg_cpu.c_str(), comm, pd.data(), 1), DSOPT_EINVAL);
  CHECK_ERROR_MENTIONS("params[0].data is memory of CUDA device");
  dsopt_optimizer *cpu = nullptr, *cuda = nullptr;
  if (CHECK_OK(dsopt_create(&cpu, cfg_cpu.c_str(), comm, ph.data(), 1)) &&
      CHECK_OK(dsopt_create(&cuda, cfg_cuda.c_str(), comm, pd.data(), 1))) {
    dsopt_step_info info = new_info();
    CHECK_STATUS(dsopt_step(cuda, gh.data(), 1, &info), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("grads[0].data is host memory");
    CHECK_STATUS(dsopt_step(cpu, gd.data(), 1, &info), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("grads[0].data is memory of CUDA device");
    CHECK_STATUS(dsopt_grad_ready(cuda, 0, &gh[0]), DSOPT_EINVAL);
    CHECK_ERROR_MENTIONS("host memory");
    // Nothing changed: both take one step from the same state.
    dsopt_step_info a = new_info(), b = new_info();
    CHECK_OK(dsopt_step(cpu, gh.data(), 1, &a));
    CHECK_OK(dsopt_step(cuda, gd.data(), 1, &b));
    CHECK(a.step == 1 && b.step == 1);
    CHECK(params.device[0].to_host() == params.host[0]);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1) {
      cuda_or_die(cudaSetDevice(1), "cudaSetDevice(1)");
      other.add(n, DSOPT_FLOAT32, 0, grads.host[0]);
      cuda_or_die(cudaSetDevice(0), "cudaSetDevice(0)");
      std::vector<dsopt_tensor> g1 = other.device_tensors();
      CHECK_STATUS(dsopt_step(cuda, g1.data(), 1, &info), DSOPT_EINVAL);
      CHECK_ERROR_MENTIONS("memory of CUDA device 1 but the optimizer's device is cuda:0");
    }
  }
  dsopt_destroy(cuda);
  dsopt_destroy(cpu);
  std::printf("%s wrong-device buffers\n", check_failed_count == 0 ? "ok  " : "FAIL");
  check_current_test = "";
}

}  // namespace

int main() {
  skip_without_device();
  dsopt_comm* comm = nullptr;
  if (!CHECK_OK(dsopt_comm_create_local(&comm))) return check_finish();
  std::printf("%s\n", dsopt_build_info());
  buffers_on_the_wrong_device_are_rejected(comm);

  std::vector<Case> cases;
  for (const Config& cfg : kConfigs)
    for (int32_t p : kDtypes)
      for (int32_t g : kDtypes)
        cases.push_back({&cfg, p, g,
                         std::string(cfg.name) + " param=" + dtype_label(p) + " grad=" + dtype_label(g)});
  for (const Case& c : cases) run_case(c, comm);

  dsopt_comm_destroy(comm);
  return check_finish();
}
