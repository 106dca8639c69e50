// The CUDA compressed-allreduce kernels (Kernels::car_*) against the CPU
// ones, bit for bit, on the same random state: every primitive for world
// sizes 1 to 16 (the primitives need no communication: `world` only shapes
// the chunks), empty tensors, chunk boundaries inside a warp, -0.0, ties
// and NaN. Scales and weights are host arrays that the caller may reuse
// as soon as a call returns: they are overwritten right after each
// asynchronous call. Built against the core's objects.
// Skips (exit code 77) on machines without a CUDA device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/kernels.hpp"

using namespace dsopt;

namespace {

int g_failed = 0, g_passed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  std::printf("FAIL %s\n", what.c_str());
  std::fflush(stdout);
}

void cuda_or_die(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::printf("FAIL: %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

uint64_t g_state = 0x2545F4914F6CDD1Dull;
uint64_t next_u64() {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return g_state * 0x2545F4914F6CDD1Dull;
}
float next_float() {
  const uint64_t r = next_u64();
  switch (r % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 0.25f;  // ties with scales[0]
    case 3: return -0.25f;
  }
  return float(double(int64_t(r >> 11) - (int64_t(1) << 52)) / double(int64_t(1) << 52));
}

bool same_float(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}
bool same_double(double a, double b) {
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y || (a != a && b != b);
}

int64_t padded_length(int64_t n, int world, bool compact) {
  const int64_t unit = compact ? int64_t(8) * world
                               : int64_t(world) * (int64_t(8) * world / std::gcd(int64_t(world), int64_t(8)));
  return n % unit == 0 ? n : n + unit - n % unit;
}

// A device copy of a host vector.
template <class T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    void* p = nullptr;
    cuda_or_die(cudaMalloc(&p, n_ * sizeof(T) + 1), "cudaMalloc");
    p_ = static_cast<T*>(p);
    cuda_or_die(cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Dev() { cudaFree(p_); }
  Dev(Dev&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Dev(const Dev&) = delete;
  T* get() const { return p_; }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    cuda_or_die(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_or_die(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_float(float(a[i]), float(b[i]))) return false;
  return true;
}
bool same_bytes(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a == b; }

void run_case(Kernels& cpu, Kernels& gpu, int world, const std::vector<int64_t>& sizes, bool compact,
              bool nan) {
  const std::string label = "P=" + std::to_string(world) + " tensors=" + std::to_string(sizes.size()) +
                            (compact ? " compact" : "") + (nan ? " nan" : "");
  const int64_t count = int64_t(sizes.size());
  std::vector<CarTensor> ht, dt;
  std::vector<std::vector<float>> x, ew, es;
  std::vector<Dev<float>> dx, dew, des;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    const int64_t padded = padded_length(n, world, compact);
    std::vector<float> a(size_t(n) + 1), b(size_t(padded) + 1), c(size_t(padded / world) + 1);
    for (float& v : a) v = next_float();
    for (float& v : b) v = next_float();
    for (float& v : c) v = next_float();
    if (nan && n > 3) a[3] = NAN;
    x.push_back(a);
    ew.push_back(b);
    es.push_back(c);
    dx.emplace_back(a);
    dew.emplace_back(b);
    des.emplace_back(c);
    ht.push_back(CarTensor{nullptr, n, padded, nullptr, nullptr, offset});
    offset += padded / world / 8;
  }
  for (int64_t i = 0; i < count; ++i) {
    dt.push_back(ht[size_t(i)]);
    ht[size_t(i)].x = x[size_t(i)].data();
    ht[size_t(i)].worker_error = ew[size_t(i)].data();
    ht[size_t(i)].server_error = es[size_t(i)].data();
    dt[size_t(i)].x = dx[size_t(i)].get();
    dt[size_t(i)].worker_error = dew[size_t(i)].get();
    dt[size_t(i)].server_error = des[size_t(i)].get();
  }
  const int64_t msg_bytes = offset;
  auto compare_state = [&](const std::string& what) {
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) {
      ok &= same(x[size_t(i)], dx[size_t(i)].host());
      ok &= same(ew[size_t(i)], dew[size_t(i)].host());
      ok &= same(es[size_t(i)], des[size_t(i)].host());
    }
    check(ok, label + ": " + what + ": x, e_w and e_s");
  };
  auto compare_sums = [&](const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
    bool ok = true;
    for (size_t i = 0; i < a.size(); ++i) ok &= same_double(a[i], b[i]);
    check(ok, label + ": " + what);
  };

  std::vector<float> scales(static_cast<size_t>(count)), table(static_cast<size_t>(count) * size_t(world));
  for (float& v : scales) v = std::fabs(next_float()) + 0.25f;
  for (float& v : table) v = next_float();
  scales[0] = 0.25f;
  std::vector<uint8_t> in(size_t(msg_bytes) * size_t(world) + 1);
  for (uint8_t& v : in) v = uint8_t(next_u64());
  const Dev<uint8_t> din(in);

  // W1/W2
  {
    std::vector<double> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
    cpu.car_worker_sumsq(ht.data(), count, a.data());
    gpu.car_worker_sumsq(dt.data(), count, b.data());
    compare_sums(a, b, "worker sums of squares");
  }
  // W3-W6, with the host scales overwritten as soon as the call returns.
  {
    std::vector<uint8_t> a(size_t(msg_bytes) * size_t(world) + 1, 0xA5);
    const Dev<uint8_t> db(a);
    std::vector<float> s = scales;
    cpu.car_worker_pack(ht.data(), count, world, scales.data(), a.data(), msg_bytes);
    gpu.car_worker_pack(dt.data(), count, world, s.data(), db.get(), msg_bytes);
    std::fill(s.begin(), s.end(), 1e30f);
    check(same_bytes(a, db.host()), label + ": worker sign bytes");
    compare_state("after worker pack");
  }
  // S1/S2
  {
    std::vector<double> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
    cpu.car_server_sum(ht.data(), count, world, in.data(), msg_bytes, table.data(), a.data());
    gpu.car_server_sum(dt.data(), count, world, din.get(), msg_bytes, table.data(), b.data());
    compare_sums(a, b, "server sums of squares");
    compare_state("after server sum");
  }
  // S4/S5
  {
    std::vector<uint8_t> a(size_t(msg_bytes) + 1, 0x5A);
    const Dev<uint8_t> db(a);
    std::vector<float> s = scales;
    cpu.car_server_pack(ht.data(), count, world, scales.data(), a.data());
    gpu.car_server_pack(dt.data(), count, world, s.data(), db.get());
    std::fill(s.begin(), s.end(), -1e30f);
    check(same_bytes(a, db.host()), label + ": server sign bytes");
    compare_state("after server pack");
  }
  // F1/F2
  {
    std::vector<float> t = table;
    cpu.car_decode(ht.data(), count, world, in.data(), msg_bytes, table.data());
    gpu.car_decode(dt.data(), count, world, din.get(), msg_bytes, t.data());
    std::fill(t.begin(), t.end(), 7.0f);
    compare_state("after decode");
  }
  std::printf("%s %s\n", g_failed ? "...." : "ok  ", label.c_str());
}

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    return 77;
  }
  std::unique_ptr<Kernels> cpu = make_cpu_kernels(0), gpu;
  try {
    gpu = make_cuda_kernels(nullptr);
  } catch (const Error& e) {
    std::printf("FAIL: make_cuda_kernels: %s\n", e.what());
    return 1;
  }
  try {
    for (int world : {1, 2, 3, 4, 5, 8, 16}) {
      run_case(*cpu, *gpu, world, {1000}, false, false);
      run_case(*cpu, *gpu, world, {0, 1, 7, 8, 100, 0, 4095, 4096, 4097, 12289, 70001, 0}, false, false);
      run_case(*cpu, *gpu, world, {5, 333, 9000, 4096 * 3 + 40}, true, false);
      run_case(*cpu, *gpu, world, {17, 20000}, false, true);
      run_case(*cpu, *gpu, world, {1000003}, false, false);
    }
    run_case(*cpu, *gpu, 3, {4096 * 3 * 8 + 1}, true, false);
    std::vector<int64_t> many;  // more tensors than one launch's parameters could list
    for (int i = 0; i < 300; ++i) many.push_back(1 + (i * 7919) % 5000);
    run_case(*cpu, *gpu, 4, many, false, false);
  } catch (const Error& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
