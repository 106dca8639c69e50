// An optimizer on an NCCL communicator of one rank (ncclCommInitAll on one
// device) with "device": "cuda" and the caller's stream: creation (with its
// config agreement over the communicator), steps and state saving work, and
// the results are bit-identical to a CPU optimizer on a local communicator,
// without and with ZeRO-2.
// NCCL is opened with dlopen, as libdsopt does, so both use the same
// library. Skips (exit code 77) without a CUDA device or without
// libnccl.so.2.
#include <dlfcn.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "gpu_test.hpp"

using namespace gpu_test;

namespace {

struct Nccl {
  decltype(&ncclCommInitAll) init_all = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

Nccl load_nccl_or_skip() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("SKIPPED: cannot load libnccl.so.2 (%s)\n", dlerror());
    std::exit(kSkipped);
  }
  Nccl n;
  n.init_all = reinterpret_cast<decltype(n.init_all)>(dlsym(lib, "ncclCommInitAll"));
  n.destroy = reinterpret_cast<decltype(n.destroy)>(dlsym(lib, "ncclCommDestroy"));
  n.error_string = reinterpret_cast<decltype(n.error_string)>(dlsym(lib, "ncclGetErrorString"));
  if (!n.init_all || !n.destroy || !n.error_string) {
    std::printf("FAIL: libnccl.so.2 lacks ncclCommInitAll/ncclCommDestroy/ncclGetErrorString\n");
    std::exit(1);
  }
  return n;
}

const int64_t kSizes[] = {1, 4097, 65537, 300001};
const int32_t kParamDtypes[] = {DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16, DSOPT_FLOAT32};
const int32_t kGradDtypes[] = {DSOPT_FLOAT16, DSOPT_FLOAT32, DSOPT_BFLOAT16, DSOPT_BFLOAT16};
constexpr int kSteps = 5;
// AdamW with loss scaling and clipping, and the same under ZeRO-2 with
// buckets smaller than the model (the reduce-scatter and allgather really
// called on device memory, several per step).
const char* const kBodies[] = {
    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
    "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 10}, \"gradient_clipping\": 1.0",
    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}, "
    "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 10}, \"gradient_clipping\": 1.0, "
    "\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 50000, "
    "\"allgather_bucket_size\": 50000}"};

void null_communicator_is_rejected() {
  dsopt_comm* c = nullptr;
  CHECK_STATUS(dsopt_comm_create_nccl(&c, nullptr, nullptr), DSOPT_EINVAL);
}

void one_rank_nccl_step_matches_cpu(const Nccl& nccl, const char* body, const char* name) {
  check_current_test = name;
  int device = 0;
  cuda_or_die(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cuda_or_die(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  ncclComm_t nc = nullptr;
  const ncclResult_t nr = nccl.init_all(&nc, 1, &device);
  if (!CHECKF(nr == ncclSuccess, "ncclCommInitAll: %s", nccl.error_string(nr))) return;

  dsopt_comm *nccl_comm = nullptr, *local = nullptr;
  CHECK_OK(dsopt_comm_create_nccl(&nccl_comm, reinterpret_cast<struct ncclComm*>(nc),
                                  reinterpret_cast<struct CUstream_st*>(stream)));
  CHECK_OK(dsopt_comm_create_local(&local));
  CHECK_EQ_INT(dsopt_comm_rank(nccl_comm), 0);
  CHECK_EQ_INT(dsopt_comm_size(nccl_comm), 1);

  rng r = rng_for(7, 0, 0);
  TensorSet cpu_params, cuda_params;
  for (size_t i = 0; i < sizeof kSizes / sizeof kSizes[0]; ++i) {
    std::vector<uint8_t> bytes = random_bytes(&r, kSizes[i], kParamDtypes[i], 0.5);
    cpu_params.add(kSizes[i], kParamDtypes[i], 0, bytes);
    cuda_params.add(kSizes[i], kParamDtypes[i], 0, bytes);
  }
  const std::string cfg_cpu = with_device(body, "cpu"), cfg_cuda = with_device(body, "cuda");
  std::vector<dsopt_tensor> ph = cpu_params.host_tensors(), pd = cuda_params.device_tensors();
  dsopt_optimizer *cpu = nullptr, *cuda = nullptr;
  const bool created =
      CHECK_OK(dsopt_create(&cpu, cfg_cpu.c_str(), local, ph.data(), int64_t(ph.size()))) &&
      CHECK_OK(dsopt_create(&cuda, cfg_cuda.c_str(), nccl_comm, pd.data(), int64_t(pd.size())));

  for (int s = 0; created && s < kSteps; ++s) {
    double scale = 0;
    CHECK_OK(dsopt_get_loss_scale(cpu, &scale));
    TensorSet grads;
    for (size_t i = 0; i < sizeof kSizes / sizeof kSizes[0]; ++i)
      grads.add(kSizes[i], kGradDtypes[i], 0, random_bytes(&r, kSizes[i], kGradDtypes[i], 0.01 * scale));
    std::vector<dsopt_tensor> gh = grads.host_tensors(), gd = grads.device_tensors();
    dsopt_step_info a, b;
    std::memset(&a, 0, sizeof a);
    std::memset(&b, 0, sizeof b);
    a.struct_size = b.struct_size = sizeof a;
    CHECK_OK(dsopt_step(cpu, gh.data(), int64_t(gh.size()), &a));
    CHECK_OK(dsopt_step(cuda, gd.data(), int64_t(gd.size()), &b));
    cuda_or_die(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    CHECKF(a.skipped == b.skipped && a.step == b.step, "step %d: skipped/step agree", s);
    CHECKF(bits_of(a.loss_scale) == bits_of(b.loss_scale), "step %d: loss scale agrees", s);
    CHECKF(same_double(a.grad_norm, b.grad_norm), "step %d: grad_norm cpu %.17g nccl %.17g", s,
           a.grad_norm, b.grad_norm);
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      const int64_t at = first_difference(cpu_params.host[i], cuda_params.device[i].to_host());
      CHECKF(at < 0, "step %d: tensor %zu differs at byte %lld", s, i, (long long)at);
    }
  }
  if (created) {
    const std::vector<uint8_t> a = save_state(cpu), b = save_state(cuda);
    CHECKF(!a.empty() && first_difference(a, b) < 0, "state blobs are identical");
    CHECK_OK(dsopt_state_load(cuda, a.data(), a.size()));  // collective over NCCL
  }

  dsopt_destroy(cuda);
  dsopt_destroy(cpu);
  dsopt_comm_destroy(nccl_comm);
  dsopt_comm_destroy(local);
  nccl.destroy(nc);
  cudaStreamDestroy(stream);
  check_current_test = "";
}

}  // namespace

int main() {
  skip_without_device();
  const Nccl nccl = load_nccl_or_skip();
  RUN_TEST(null_communicator_is_rejected);
  one_rank_nccl_step_matches_cpu(nccl, kBodies[0], "one_rank_nccl_step_matches_cpu");
  one_rank_nccl_step_matches_cpu(nccl, kBodies[1], "one_rank_nccl_zero2_step_matches_cpu");
  return check_finish();
}
