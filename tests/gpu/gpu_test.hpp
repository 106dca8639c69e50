// Shared pieces of the GPU tests: the skip rule, device buffers, and
// helpers that run the same optimizer on "device": "cpu" (host buffers) and
// "device": "cuda" (device buffers) and compare them bit for bit.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "check.h"
#include "support/dtype_ref.h"
#include "support/rng.h"
}

namespace gpu_test {

// ctest's SKIP_RETURN_CODE for these programs.
constexpr int kSkipped = 77;

// Exits with kSkipped when this machine has no usable CUDA device.
inline void skip_without_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    std::exit(kSkipped);
  }
}

inline void cuda_or_die(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::printf("FAIL: %s: %s\n", what, cudaGetErrorString(err));
  std::exit(1);
}

// One device allocation holding a copy of host bytes.
class DeviceBytes {
 public:
  DeviceBytes() = default;
  explicit DeviceBytes(const std::vector<uint8_t>& host) : size_(host.size()) {
    cuda_or_die(cudaMalloc(&p_, size_), "cudaMalloc");
    cuda_or_die(cudaMemcpy(p_, host.data(), size_, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  ~DeviceBytes() {
    if (p_) cudaFree(p_);
  }
  DeviceBytes(DeviceBytes&& o) noexcept : p_(o.p_), size_(o.size_) { o.p_ = nullptr; }
  DeviceBytes& operator=(DeviceBytes&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(size_, o.size_);
    return *this;
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;

  void* get() const { return p_; }
  std::vector<uint8_t> to_host() const {
    std::vector<uint8_t> h(size_);
    cuda_or_die(cudaMemcpy(h.data(), p_, size_, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return h;
  }
  void assign(const std::vector<uint8_t>& host) {
    cuda_or_die(cudaMemcpy(p_, host.data(), host.size(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

// Tensors in host memory (bytes) and the same bytes on the device.
struct TensorSet {
  std::vector<int64_t> numel;
  std::vector<int32_t> dtype;
  std::vector<int32_t> group;
  std::vector<std::vector<uint8_t>> host;
  std::vector<DeviceBytes> device;

  void add(int64_t n, int32_t dt, int32_t grp, std::vector<uint8_t> bytes) {
    numel.push_back(n);
    dtype.push_back(dt);
    group.push_back(grp);
    device.emplace_back(bytes);
    host.push_back(std::move(bytes));
  }
  size_t size() const { return numel.size(); }
  std::vector<dsopt_tensor> host_tensors() {
    std::vector<dsopt_tensor> t(size());
    for (size_t i = 0; i < size(); ++i) t[i] = {host[i].data(), numel[i], dtype[i], group[i]};
    return t;
  }
  std::vector<dsopt_tensor> device_tensors() {
    std::vector<dsopt_tensor> t(size());
    for (size_t i = 0; i < size(); ++i) t[i] = {device[i].get(), numel[i], dtype[i], group[i]};
    return t;
  }
  // Host bytes copied to the device again (after changing `host`).
  void upload() {
    for (size_t i = 0; i < size(); ++i) device[i].assign(host[i]);
  }
};

// n elements of `dtype`, each rng_signed(scale) rounded into the dtype.
inline std::vector<uint8_t> random_bytes(rng* r, int64_t n, int32_t dtype, double scale) {
  std::vector<uint8_t> b(size_t(n) * dtype_bytes(dtype));
  for (int64_t i = 0; i < n; ++i) element_set(b.data(), dtype, i, float(rng_signed(r, scale)));
  return b;
}

inline uint64_t bits_of(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

// Same bits, or both NaN (NaN payloads are not part of the contract).
inline bool same_double(double a, double b) {
  return bits_of(a) == bits_of(b) || (a != a && b != b);
}

// Index of the first differing byte of two equally long buffers, or -1.
inline int64_t first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

inline std::vector<uint8_t> save_state(dsopt_optimizer* opt) {
  uint64_t size = 0;
  if (!CHECK_OK(dsopt_state_size(opt, &size))) return {};
  std::vector<uint8_t> blob(static_cast<size_t>(size));
  uint64_t written = 0;
  if (!CHECK_OK(dsopt_state_save(opt, blob.data(), size, &written))) return {};
  CHECK_EQ_INT(written, size);
  return blob;
}

// The config text with "device" set to `device`; `body` holds the other keys.
inline std::string with_device(const std::string& body, const char* device) {
  return std::string("{\"device\": \"") + device + "\", " + body + "}";
}

}  // namespace gpu_test
