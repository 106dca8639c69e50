// CUDA runtime errors as dsopt::Error: DSOPT_ENOMEM for failed allocations,
// DSOPT_ECUDA ("<call>: <cudaGetErrorString>") for everything else.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "base/error.hpp"

namespace dsopt {

[[noreturn]] inline void cuda_fail(cudaError_t err, const char* call) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  const int status = err == cudaErrorMemoryAllocation ? DSOPT_ENOMEM : DSOPT_ECUDA;
  std::string name(call);
  name = name.substr(0, name.find('('));  // "cudaMalloc(&p, n)" -> "cudaMalloc"
  fail(status, name + ": " + cudaGetErrorString(err));
}

inline void cuda_check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) cuda_fail(err, call);
}

// Makes the device an object was created on current for one scope, so work
// goes to the right GPU whatever the caller made current in between.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The same for release paths and destructors, which must not throw.
class DeviceGuardNoThrow {
 public:
  explicit DeviceGuardNoThrow(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ >= 0 && previous_ != device) (void)cudaSetDevice(device);
  }
  ~DeviceGuardNoThrow() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_)
      (void)cudaSetDevice(previous_);
  }
  DeviceGuardNoThrow(const DeviceGuardNoThrow&) = delete;
  DeviceGuardNoThrow& operator=(const DeviceGuardNoThrow&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace dsopt

// DSOPT_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s)) throws with the call's text.
#define DSOPT_CUDA_CHECK(call) ::dsopt::cuda_check((call), #call)
