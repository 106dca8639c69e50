// 1-bit Adam on "device": "cpu" (host buffers) and "device": "cuda" (device
// buffers) side by side: the same parameters, the same gradients and the
// same momentum masks (a host copy for the CPU optimizer, a device copy for
// the CUDA one), stepped together across the warmup/compression boundary
// and compared bit for bit after every step (parameters, step info), then
// through their state blobs (moments, stage, compression errors) and a
// resume of each blob on the other device. Used on one rank (local comm)
// and on several (MPI or NCCL): nothing here returns early, so every rank
// makes the same collective calls whatever fails.
#pragma once
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test.hpp"

namespace gpu_test {

struct OneBitCase {
  std::string label;
  std::string body;                 // the config without "device"
  int groups = 1;                   // tensor i is in group i % groups
  std::vector<int64_t> sizes;
  int32_t param_dtype = DSOPT_FLOAT32, grad_dtype = DSOPT_FLOAT32;
  bool loss_scaled = false;         // gradients are multiplied by the loss scale
  std::vector<int> inf_steps;       // steps whose gradients hold an Inf on rank inf_rank
  int inf_rank = 0;
  std::vector<int> masked;          // tensors with a momentum mask
  int clear_mask_step = -1;         // before this step the mask of masked[0] is cleared
  int steps = 10;
  uint64_t seed = 1;
  bool expect_compressed = true;    // some step must use 1-bit communication (not Adam/ZeRO)
  bool hand_over = false;           // the CUDA optimizer gets its gradients by dsopt_grad_ready
  // Gradients on a grid of 2^-12 (fp32 gradients only): sums of a few are
  // exact in any order, so that device allreduces in the backend's order
  // (more than 2 ranks) give the host path's fixed-order bits.
  bool exact_grads = false;
};

inline dsopt_step_info new_info() {
  dsopt_step_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  return info;
}

// 0 at every fifth element (offset by the tensor), 1 elsewhere.
inline std::vector<uint8_t> mask_bytes(int64_t n, int tensor) {
  std::vector<uint8_t> b(size_t(n) * 4);
  for (int64_t k = 0; k < n; ++k) element_set(b.data(), DSOPT_FLOAT32, k, (k + tensor) % 5 ? 1.0f : 0.0f);
  return b;
}

// Parameters of a CPU optimizer (host bytes) against those of a CUDA one.
inline bool params_match(const std::string& label, const std::string& when, TensorSet& cpu,
                         TensorSet& cuda) {
  bool all = true;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const int64_t at = first_difference(cpu.host[i], cuda.device[i].to_host());
    all &= CHECKF(at < 0, "%s %s: tensor %zu (numel %lld) differs at byte %lld", label.c_str(),
                  when.c_str(), i, (long long)cpu.numel[i], (long long)at) != 0;
  }
  return all;
}

inline bool info_match(const std::string& label, int step, const dsopt_step_info& a,
                       const dsopt_step_info& b) {
  bool ok = true;
  const char* l = label.c_str();
  ok &= CHECKF(a.skipped == b.skipped, "%s step %d: skipped cpu %d cuda %d", l, step, a.skipped,
               b.skipped) != 0;
  ok &= CHECKF(a.compressed == b.compressed, "%s step %d: compressed cpu %d cuda %d", l, step,
               a.compressed, b.compressed) != 0;
  ok &= CHECKF(a.step == b.step, "%s step %d: step cpu %lld cuda %lld", l, step, (long long)a.step,
               (long long)b.step) != 0;
  ok &= CHECKF(bits_of(a.loss_scale) == bits_of(b.loss_scale), "%s step %d: loss_scale %.17g vs %.17g",
               l, step, a.loss_scale, b.loss_scale) != 0;
  ok &= CHECKF(same_double(a.grad_norm, b.grad_norm), "%s step %d: grad_norm cpu %.17g cuda %.17g", l,
               step, a.grad_norm, b.grad_norm) != 0;
  ok &= CHECKF(a.phase == b.phase, "%s step %d: phase cpu %d cuda %d", l, step, a.phase, b.phase) != 0;
  ok &= CHECKF(a.bytes_sent == b.bytes_sent, "%s step %d: bytes_sent cpu %llu cuda %llu", l, step,
               (unsigned long long)a.bytes_sent, (unsigned long long)b.bytes_sent) != 0;
  ok &= CHECKF(a.bytes_inter_node == b.bytes_inter_node, "%s step %d: bytes_inter_node cpu %llu cuda %llu", l,
               step, (unsigned long long)a.bytes_inter_node, (unsigned long long)b.bytes_inter_node) != 0;
  return ok;
}

// This rank's gradients for one step (host and device copies).
inline TensorSet make_grads(const OneBitCase& c, int rank, int step, double loss_scale) {
  rng r = rng_for(c.seed, uint64_t(rank) + 1, uint64_t(step));
  TensorSet g;
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    const double scale = 0.01 * (c.loss_scaled ? loss_scale : 1.0);
    std::vector<uint8_t> bytes = random_bytes(&r, c.sizes[i], c.grad_dtype, scale);
    if (c.exact_grads && c.grad_dtype == DSOPT_FLOAT32) {
      float* v = reinterpret_cast<float*>(bytes.data());
      for (int64_t k = 0; k < c.sizes[i]; ++k) v[k] = std::round(v[k] * 4096.0f) / 4096.0f;
    }
    const size_t inf_tensor = c.sizes.size() > 3 ? 3 : c.sizes.size() - 1;
    for (int s : c.inf_steps)
      if (s == step && rank == c.inf_rank && i == inf_tensor)
        element_set(bytes.data(), c.grad_dtype, 17 % c.sizes[i], INFINITY);
    g.add(c.sizes[i], c.grad_dtype, 0, std::move(bytes));
  }
  return g;
}

// The masks of a case as tensors: host ones for the CPU optimizer, device
// ones for the CUDA optimizer.
struct Masks {
  TensorSet set;        // one entry per c.masked
  std::vector<bool> on;  // still set (cleared ones are off)
  explicit Masks(const OneBitCase& c) {
    for (int i : c.masked) {
      set.add(c.sizes[size_t(i)], DSOPT_FLOAT32, 0, mask_bytes(c.sizes[size_t(i)], i));
      on.push_back(true);
    }
  }
  void apply(const OneBitCase& c, dsopt_optimizer* cpu, dsopt_optimizer* cuda) {
    std::vector<dsopt_tensor> h = set.host_tensors(), d = set.device_tensors();
    for (size_t k = 0; k < c.masked.size(); ++k) {
      CHECKF(dsopt_set_momentum_mask(cpu, c.masked[k], on[k] ? &h[k] : nullptr) == DSOPT_OK,
             "%s: mask of tensor %d on the CPU optimizer", c.label.c_str(), c.masked[k]);
      CHECKF(dsopt_set_momentum_mask(cuda, c.masked[k], on[k] ? &d[k] : nullptr) == DSOPT_OK,
             "%s: mask of tensor %d on the CUDA optimizer", c.label.c_str(), c.masked[k]);
    }
  }
};

// One more step of both optimizers with the same gradients.
// Returns the CPU optimizer's step info.
inline dsopt_step_info step_both(const OneBitCase& c, int step, dsopt_optimizer* cpu, dsopt_optimizer* cuda,
                                 TensorSet& grads, cudaStream_t sync_stream) {
  std::vector<dsopt_tensor> gh = grads.host_tensors(), gd = grads.device_tensors();
  dsopt_step_info a = new_info(), b = new_info();
  CHECKF(dsopt_step(cpu, gh.data(), int64_t(gh.size()), &a) == DSOPT_OK, "%s step %d: CPU step",
         c.label.c_str(), step);
  CHECKF(dsopt_step(cuda, gd.data(), int64_t(gd.size()), &b) == DSOPT_OK, "%s step %d: CUDA step",
         c.label.c_str(), step);
  if (sync_stream) cuda_or_die(cudaStreamSynchronize(sync_stream), "cudaStreamSynchronize");
  info_match(c.label, step, a, b);
  return a;
}

// Runs a case: cpu_comm for the CPU optimizer, cuda_comm for the CUDA one
// (the same communicator, or an MPI one and an NCCL one over the same
// ranks). `after_step(cpu_params, step, phase)` runs after every step on
// every rank (collective checks go there; `phase` is the step's
// dsopt_step_info.phase: 0/1 Adam's local steps leave replicas apart). Returns whether the case ran (false:
// the library rejects the combination, the same way on both devices).
inline bool run_onebit_pair(const OneBitCase& c, int rank, dsopt_comm* cpu_comm, dsopt_comm* cuda_comm,
                            cudaStream_t cuda_stream,
                            const std::function<void(TensorSet&, int, int)>& after_step) {
  check_current_test = c.label.c_str();
  const int failed_before = check_failed_count;
  rng r = rng_for(c.seed, 0, 1000);  // the same parameters on every rank
  TensorSet cpu_params, cuda_params;
  for (size_t i = 0; i < c.sizes.size(); ++i) {
    std::vector<uint8_t> bytes = random_bytes(&r, c.sizes[i], c.param_dtype, 0.5);
    const int32_t group = int32_t(i) % c.groups;
    cpu_params.add(c.sizes[i], c.param_dtype, group, bytes);
    cuda_params.add(c.sizes[i], c.param_dtype, group, bytes);
  }
  const std::string cfg_cpu = with_device(c.body, "cpu"), cfg_cuda = with_device(c.body, "cuda");
  dsopt_optimizer *cpu = nullptr, *cuda = nullptr;
  std::vector<dsopt_tensor> ph = cpu_params.host_tensors(), pd = cuda_params.device_tensors();
  const int rc_cpu = dsopt_create(&cpu, cfg_cpu.c_str(), cpu_comm, ph.data(), int64_t(ph.size()));
  const int rc_cuda = dsopt_create(&cuda, cfg_cuda.c_str(), cuda_comm, pd.data(), int64_t(pd.size()));
  if (rc_cpu != DSOPT_OK || rc_cuda != DSOPT_OK) {
    // A combination the library rejects must be rejected the same way on both.
    CHECKF(rc_cuda == rc_cpu, "%s: create cpu %d, cuda %d", c.label.c_str(), rc_cpu, rc_cuda);
    if (rc_cpu != DSOPT_OK && rank == 0) check_skip(c.label.c_str(), dsopt_last_error());
    dsopt_destroy(cuda);
    dsopt_destroy(cpu);
    return false;
  }

  Masks masks(c);
  masks.apply(c, cpu, cuda);
  bool compressed_seen = false;
  for (int s = 0; s < c.steps; ++s) {
    if (s == c.clear_mask_step && !c.masked.empty()) {
      masks.on[0] = false;
      masks.apply(c, cpu, cuda);
    }
    double scale_cpu = 0, scale_cuda = 0;
    CHECK_OK(dsopt_get_loss_scale(cpu, &scale_cpu));
    CHECK_OK(dsopt_get_loss_scale(cuda, &scale_cuda));
    CHECKF(scale_cpu == scale_cuda, "%s step %d: loss scales %g vs %g", c.label.c_str(), s, scale_cpu,
           scale_cuda);
    TensorSet grads = make_grads(c, rank, s, scale_cpu);
    std::vector<dsopt_tensor> gh = grads.host_tensors(), gd = grads.device_tensors();
    dsopt_step_info a = new_info(), b = new_info();
    CHECKF(dsopt_step(cpu, gh.data(), int64_t(gh.size()), &a) == DSOPT_OK, "%s step %d: CPU step",
           c.label.c_str(), s);
    if (c.hand_over) {  // in backward's order, then the step completes them
      for (size_t i = gd.size(); i-- > 0;)
        CHECKF(dsopt_grad_ready(cuda, int64_t(i), &gd[i]) == DSOPT_OK, "%s step %d: grad_ready %zu",
               c.label.c_str(), s, i);
      CHECKF(dsopt_step(cuda, nullptr, 0, &b) == DSOPT_OK, "%s step %d: CUDA step", c.label.c_str(), s);
    } else {
      CHECKF(dsopt_step(cuda, gd.data(), int64_t(gd.size()), &b) == DSOPT_OK, "%s step %d: CUDA step",
             c.label.c_str(), s);
    }
    if (cuda_stream) cuda_or_die(cudaStreamSynchronize(cuda_stream), "cudaStreamSynchronize");
    if (c.hand_over) {  // the same traffic plus the 16-byte handshake of the first hand-over
      const int world = dsopt_comm_size(cuda_comm);
      const uint64_t handshake = world > 1 ? uint64_t(2 * (world - 1) * 16 / world) : 0;
      CHECKF(b.bytes_sent == a.bytes_sent + handshake, "%s step %d: bytes_sent %llu, expected %llu",
             c.label.c_str(), s, (unsigned long long)b.bytes_sent,
             (unsigned long long)(a.bytes_sent + handshake));
      b.bytes_sent = a.bytes_sent;
    }
    info_match(c.label, s, a, b);
    compressed_seen |= a.compressed != 0 && a.skipped == 0;
    params_match(c.label, "after step " + std::to_string(s), cpu_params, cuda_params);
    if (after_step) after_step(cpu_params, s, a.phase);
  }
  CHECKF(compressed_seen || !c.expect_compressed, "%s: some step ran in the compression stage",
         c.label.c_str());

  const std::vector<uint8_t> blob_cpu = save_state(cpu), blob_cuda = save_state(cuda);
  CHECKF(!blob_cpu.empty() && first_difference(blob_cpu, blob_cuda) < 0,
         "%s: state blobs (%zu and %zu bytes) differ at byte %lld", c.label.c_str(), blob_cpu.size(),
         blob_cuda.size(), (long long)first_difference(blob_cpu, blob_cuda));

  // Each blob resumed on the other device, from the other's parameters
  // (masks are not in blobs: set again).
  TensorSet cpu2_params, cuda2_params;
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    cpu2_params.add(cpu_params.numel[i], c.param_dtype, cpu_params.group[i], cuda_params.device[i].to_host());
    cuda2_params.add(cpu_params.numel[i], c.param_dtype, cpu_params.group[i], cpu_params.host[i]);
  }
  dsopt_optimizer *cpu2 = nullptr, *cuda2 = nullptr;
  std::vector<dsopt_tensor> ph2 = cpu2_params.host_tensors(), pd2 = cuda2_params.device_tensors();
  const int rc2_cpu = dsopt_create(&cpu2, cfg_cpu.c_str(), cpu_comm, ph2.data(), int64_t(ph2.size()));
  const int rc2_cuda = dsopt_create(&cuda2, cfg_cuda.c_str(), cuda_comm, pd2.data(), int64_t(pd2.size()));
  CHECK_OK(rc2_cpu);
  CHECK_OK(rc2_cuda);
  if (rc2_cpu == DSOPT_OK && rc2_cuda == DSOPT_OK) {  // the same on every rank (collective create)
    CHECK_OK(dsopt_state_load(cpu2, blob_cuda.data(), blob_cuda.size()));
    CHECK_OK(dsopt_state_load(cuda2, blob_cpu.data(), blob_cpu.size()));
    masks.apply(c, cpu2, cuda2);
    CHECKF(first_difference(save_state(cpu2), blob_cuda) < 0,
           "%s: the CPU optimizer that loaded the CUDA blob saves it back unchanged", c.label.c_str());
    CHECKF(first_difference(save_state(cuda2), blob_cpu) < 0,
           "%s: the CUDA optimizer that loaded the CPU blob saves it back unchanged", c.label.c_str());

    double scale = 0;
    CHECK_OK(dsopt_get_loss_scale(cpu2, &scale));
    TensorSet grads = make_grads(c, rank, c.steps, scale);
    const int phase = step_both(c, c.steps, cpu, cuda2, grads, cuda_stream).phase;
    step_both(c, c.steps, cpu2, cuda, grads, cuda_stream);
    params_match(c.label, "one step after resuming (cpu, cuda2)", cpu_params, cuda2_params);
    params_match(c.label, "one step after resuming (cpu2, cuda)", cpu2_params, cuda_params);
    params_match(c.label, "one step after resuming (cpu, cuda)", cpu_params, cuda_params);
    if (after_step) after_step(cpu_params, c.steps, phase);
  }
  dsopt_destroy(cpu2);
  dsopt_destroy(cuda2);
  dsopt_destroy(cpu);
  dsopt_destroy(cuda);
  std::printf("%s%s %s\n", check_prefix, check_failed_count == failed_before ? "ok  " : "FAIL",
              c.label.c_str());
  std::fflush(stdout);
  check_current_test = "";
  return true;
}

}  // namespace gpu_test
