// AdamW and 1-bit Adam step throughput on a CUDA device, as bytes moved per
// second, against a device-to-device copy of the same bytes (what the memory
// system allows) timed in the same run.
//
// One fp32 AdamW step reads p, g, m, v and writes p, m, v: 28 bytes per
// parameter; the default config (skip_nonfinite true) reads g once more
// (32 B). bf16 parameters and gradients with fp32 masters: master 4 + g 2 +
// m 4 + v 4 read, master 4 + m 4 + v 4 + p 2 written = 28 B. A 1-bit Adam
// compressed step on one process (the compressed allreduce is the identity)
// reads p, g, m, v and writes p, m: 24 B.
//
// Timing: CUDA events around `iters` steps after `warmup` steps, median of
// `reps` repetitions. The probe is cudaMemcpyAsync of the same byte count
// split into half read, half written (a copy of B/2 bytes moves B bytes).
//
//   adam_cuda_bench [--numel N] [--tensors K] [--iters I] [--reps R]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dsopt.h"

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "adam_cuda_bench: %s\n", what.c_str());
  std::exit(1);
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void dsopt_check(int rc, const char* what) {
  if (rc != DSOPT_OK)
    die(std::string(what) + ": " + dsopt_status_string(rc) + ": " + dsopt_last_error());
}

struct Options {
  int64_t numel = 100000000;
  int tensors = 100;
  int iters = 20, reps = 7, warmup = 3;
};

__global__ void fill(float* x, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = scale * (float(h & 0xffffff) / float(0x800000) - 1.0f);
  }
}

__global__ void to_bf16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    y[i] = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per call of `body`, timed with events over `iters` calls.
template <class Body>
double time_it(const Options& o, Body body) {
  for (int i = 0; i < o.warmup; ++i) body();
  cuda_check(cudaDeviceSynchronize(), "sync");
  cudaEvent_t a, b;
  cuda_check(cudaEventCreate(&a), "event");
  cuda_check(cudaEventCreate(&b), "event");
  std::vector<double> per_call;
  for (int r = 0; r < o.reps; ++r) {
    cuda_check(cudaEventRecord(a), "record");
    for (int i = 0; i < o.iters; ++i) body();
    cuda_check(cudaEventRecord(b), "record");
    cuda_check(cudaEventSynchronize(b), "event sync");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, a, b), "elapsed");
    per_call.push_back(double(ms) * 1e-3 / o.iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return median(per_call);
}

// One optimizer over `tensors` equal device tensors of `dtype`.
struct Case {
  std::string name;
  std::string config;
  int tensors;
  int32_t dtype;
  double bytes_per_param;
};

double run_case(const Options& o, const Case& c, float* p32, float* g32, uint16_t* p16,
                uint16_t* g16) {
  const int64_t each = o.numel / c.tensors;
  const size_t es = c.dtype == DSOPT_FLOAT32 ? 4 : 2;
  std::vector<dsopt_tensor> params(size_t(c.tensors)), grads(size_t(c.tensors));
  char* pb = c.dtype == DSOPT_FLOAT32 ? reinterpret_cast<char*>(p32) : reinterpret_cast<char*>(p16);
  char* gb = c.dtype == DSOPT_FLOAT32 ? reinterpret_cast<char*>(g32) : reinterpret_cast<char*>(g16);
  for (int t = 0; t < c.tensors; ++t) {
    params[size_t(t)] = {pb + size_t(t) * size_t(each) * es, each, c.dtype, 0};
    grads[size_t(t)] = {gb + size_t(t) * size_t(each) * es, each, c.dtype, 0};
  }
  dsopt_comm* comm = nullptr;
  dsopt_optimizer* opt = nullptr;
  dsopt_check(dsopt_comm_create_local(&comm), "dsopt_comm_create_local");
  dsopt_check(dsopt_create(&opt, c.config.c_str(), comm, params.data(), c.tensors), c.name.c_str());
  const double s = time_it(o, [&] {
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    dsopt_check(dsopt_step(opt, grads.data(), c.tensors, &info), "dsopt_step");
  });
  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (k == "--numel") o.numel = v;
    else if (k == "--tensors") o.tensors = int(v);
    else if (k == "--iters") o.iters = int(v);
    else if (k == "--reps") o.reps = int(v);
    else die("unknown flag " + k);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("adam_cuda_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  cudaDeviceProp prop;
  cuda_check(cudaGetDeviceProperties(&prop, 0), "properties");
  const int64_t n = o.numel;
  float* p32 = static_cast<float*>(device_alloc(size_t(n) * 4));
  float* g32 = static_cast<float*>(device_alloc(size_t(n) * 4));
  uint16_t* p16 = static_cast<uint16_t*>(device_alloc(size_t(n) * 2));
  uint16_t* g16 = static_cast<uint16_t*>(device_alloc(size_t(n) * 2));
  fill<<<1024, 256>>>(p32, n, 1, 1.0f);
  fill<<<1024, 256>>>(g32, n, 2, 1e-2f);
  to_bf16<<<1024, 256>>>(p32, p16, n);
  to_bf16<<<1024, 256>>>(g32, g16, n);
  cuda_check(cudaDeviceSynchronize(), "fill");

  // Probe: a copy of 14 B/param moves 28 B/param.
  const size_t probe_bytes = size_t(n) * 14;
  char* src = static_cast<char*>(device_alloc(probe_bytes));
  char* dst = static_cast<char*>(device_alloc(probe_bytes));
  cuda_check(cudaMemset(src, 1, probe_bytes), "memset");
  const double probe_s = time_it(o, [&] {
    cuda_check(cudaMemcpyAsync(dst, src, probe_bytes, cudaMemcpyDeviceToDevice), "copy");
  });
  cudaFree(src);
  cudaFree(dst);
  const double probe_gbs = 28.0 * double(n) / probe_s / 1e9;

  const std::string adamw =
      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.01}}";
  const std::string onebit =
      "\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": 1e-3, \"freeze_step\": 2}}";
  const std::string fast = ", \"skip_nonfinite\": false";
  const std::vector<Case> cases = {
      {"AdamW fp32, 1 tensor", "{\"device\": \"cuda\", " + adamw + fast + "}", 1, DSOPT_FLOAT32, 28},
      {"AdamW fp32, " + std::to_string(o.tensors) + " tensors",
       "{\"device\": \"cuda\", " + adamw + fast + "}", o.tensors, DSOPT_FLOAT32, 28},
      {"AdamW fp32, default config (+4 B check)", "{\"device\": \"cuda\", " + adamw + "}", 1,
       DSOPT_FLOAT32, 32},
      {"AdamW bf16 params, fp32 masters", "{\"device\": \"cuda\", " + adamw + fast + "}", 1,
       DSOPT_BFLOAT16, 28},
      {"1-bit Adam compressed step (1 process)", "{\"device\": \"cuda\", " + onebit + fast + "}", 1,
       DSOPT_FLOAT32, 24},
  };
  std::printf("device: %s (%d SMs), %lld parameters, median of %d x %d steps\n", prop.name,
              prop.multiProcessorCount, static_cast<long long>(n), o.reps, o.iters);
  std::printf("| case | ms per step | GB/s | vs D2D copy |\n| --- | ---: | ---: | ---: |\n");
  std::printf("| D2D copy, 28 B/param | %.3f | %.0f | 1.00 |\n", probe_s * 1e3, probe_gbs);
  for (const Case& c : cases) {
    const double s = run_case(o, c, p32, g32, p16, g16);
    const double gbs = c.bytes_per_param * double(n) / s / 1e9;
    std::printf("| %s | %.3f | %.0f | %.2f |\n", c.name.c_str(), s * 1e3, gbs, gbs / probe_gbs);
  }
  cudaFree(p32);
  cudaFree(g32);
  cudaFree(p16);
  cudaFree(g16);
  return 0;
}
