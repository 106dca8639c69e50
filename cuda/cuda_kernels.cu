// CudaKernels: the Kernels interface on one CUDA device and one stream.
// Memory operations and bookkeeping live here; the kernels are launched
// through cuda/launch.hpp.
#include <cuda_runtime_api.h>

#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "base/error.hpp"
#include "cuda_check.hpp"
#include "launch.hpp"
#include "kernels/kernels.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace {

// A device (or pinned host) buffer that only grows. Growing waits for the
// stream first, so no queued work still uses the old buffer.
class Workspace {
 public:
  Workspace(bool pinned_host, cudaStream_t stream) : pinned_(pinned_host), stream_(stream) {}
  ~Workspace() { release(); }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* get(size_t bytes) {
    if (bytes <= size_) return ptr_;
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    release();
    void* p = nullptr;
    if (pinned_) DSOPT_CUDA_CHECK(cudaMallocHost(&p, bytes));
    else DSOPT_CUDA_CHECK(cudaMalloc(&p, bytes));
    ptr_ = p;
    size_ = bytes;
    return ptr_;
  }

  void release() {
    if (ptr_ == nullptr) return;
    if (pinned_) (void)cudaFreeHost(ptr_);
    else (void)cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }

 private:
  bool pinned_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels(int device, cudaStream_t stream)
      : device_(device),
        stream_(stream),
        consts_dev_(false, stream),
        consts_host_(true, stream),
        sums_dev_(false, stream),
        sums_host_(true, stream),
        flag_dev_(false, stream),
        flag_host_(true, stream),
        staging_host_(true, stream) {
    DSOPT_CUDA_CHECK(cudaEventCreateWithFlags(&consts_copied_, cudaEventDisableTiming));
  }

  ~CudaKernels() override {
    DeviceGuardNoThrow guard(device_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaEventDestroy(consts_copied_);
    for (Workspace* w :
         {&consts_dev_, &consts_host_, &sums_dev_, &sums_host_, &flag_dev_, &flag_host_, &staging_host_})
      w->release();
  }

  Device device() const override { return Device::Cuda; }
  const char* name() const override { return "cuda"; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    DeviceGuard guard(device_);
    void* p = nullptr;
    DSOPT_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }

  void release(void* p) override {
    if (p == nullptr) return;
    DeviceGuardNoThrow guard(device_);
    (void)cudaFree(p);  // also runs on error paths and in destructors: never throws
  }

  void* host_staging(size_t bytes) override {
    DeviceGuard guard(device_);
    return staging_host_.get(bytes);
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }

  // Host copies finish before returning, as on the CPU: the caller may read
  // or reuse its host buffer right away.
  void copy_to_host(void* dst_host, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, stream_));
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_from_host(void* dst, const void* src_host, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, stream_));
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void fill_zero(void* dst, size_t bytes) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }

  void synchronize() override {
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void to_float(const TensorRef& src, float* dst) override {
    DeviceGuard guard(device_);
    cuda::launch_to_float(stream_, src, dst);
  }

  void from_float(const float* src, void* dst, DType dtype, int64_t n) override {
    DeviceGuard guard(device_);
    cuda::launch_from_float(stream_, src, dst, dtype, n);
  }

  GradStats transform(const TensorRef* src, int64_t count, float mul, float* dst,
                      double* sumsq_host) override {
    GradStats stats;
    if (count <= 0) return stats;
    DeviceGuard guard(device_);

    int64_t total_blocks = 0;
    for (int64_t i = 0; i < count; ++i) total_blocks += sum_blocks(src[i].numel);
    double* sums_dev = nullptr;
    double* sums_host = nullptr;
    if (sumsq_host != nullptr && total_blocks > 0) {
      const size_t bytes = size_t(total_blocks) * sizeof(double);
      sums_dev = static_cast<double*>(sums_dev_.get(bytes));
      sums_host = static_cast<double*>(sums_host_.get(bytes));
    }
    int* flag_dev = static_cast<int*>(flag_dev_.get(sizeof(int)));
    int* flag_host = static_cast<int*>(flag_host_.get(sizeof(int)));

    DSOPT_CUDA_CHECK(cudaMemsetAsync(flag_dev, 0, sizeof(int), stream_));
    cuda::launch_transform(stream_, src, count, mul, dst, sums_dev, flag_dev);
    DSOPT_CUDA_CHECK(
        cudaMemcpyAsync(flag_host, flag_dev, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (sums_dev != nullptr)
      DSOPT_CUDA_CHECK(cudaMemcpyAsync(sums_host, sums_dev, size_t(total_blocks) * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream_));
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));

    stats.nonfinite = *flag_host != 0;
    if (sumsq_host != nullptr) {
      // A tensor's sum: its block sums added in block order (math/sum_squares.hpp).
      const double* b = sums_host;
      for (int64_t i = 0; i < count; ++i) {
        double s = 0.0;
        for (int64_t k = 0, nb = sum_blocks(src[i].numel); k < nb; ++k) s += *b++;
        sumsq_host[i] = s;
      }
    }
    return stats;
  }

  void adam_update(const AdamSlot* slots, int64_t count, const AdamConsts* consts,
                   int32_t num_groups, float mul1, float mul2) override {
    if (count <= 0) return;
    if (num_groups <= 0) fail(DSOPT_EINTERNAL, "adam_update: no parameter groups");
    for (int64_t i = 0; i < count; ++i)
      if (slots[i].group < 0 || slots[i].group >= num_groups)
        fail(DSOPT_EINTERNAL, "adam_update: slot group out of range");
    DeviceGuard guard(device_);

    // The constants go through a pinned buffer whose previous copy must
    // have left it before it is overwritten.
    const size_t bytes = size_t(num_groups) * sizeof(AdamConsts);
    if (consts_pending_) {
      DSOPT_CUDA_CHECK(cudaEventSynchronize(consts_copied_));
      consts_pending_ = false;
    }
    void* host = consts_host_.get(bytes);
    void* dev = consts_dev_.get(bytes);
    std::memcpy(host, consts, bytes);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    DSOPT_CUDA_CHECK(cudaEventRecord(consts_copied_, stream_));
    consts_pending_ = true;

    cuda::launch_adam(stream_, slots, count, static_cast<const AdamConsts*>(dev), mul1, mul2);
  }

 private:
  int device_;
  cudaStream_t stream_;
  Workspace consts_dev_, consts_host_;
  Workspace sums_dev_, sums_host_;
  Workspace flag_dev_, flag_host_;
  Workspace staging_host_;  // MPI staging of device buffers
  cudaEvent_t consts_copied_ = nullptr;
  bool consts_pending_ = false;
};

std::string runtime_version_text() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) return "unknown";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(void* stream) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::string why = cudaGetErrorString(err);
    if (err == cudaErrorInsufficientDriver)
      why += " (no NVIDIA driver is loaded, or it is older than this build's CUDA " +
             runtime_version_text() + " runtime)";
    fail(DSOPT_EUNSUPPORTED, "\"device\": \"cuda\" needs a usable CUDA device: " + why);
  }
  if (count == 0) fail(DSOPT_EUNSUPPORTED, "\"device\": \"cuda\" needs a CUDA device; none found");

  int device = 0;
  DSOPT_CUDA_CHECK(cudaGetDevice(&device));
  const cudaError_t probe = cuda::probe_kernel_image();
  if (probe == cudaErrorNoKernelImageForDevice || probe == cudaErrorInvalidDeviceFunction) {
    cudaDeviceProp prop;
    std::string arch = "?";
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
      arch = std::to_string(prop.major) + std::to_string(prop.minor);
    (void)cudaGetLastError();
    fail(DSOPT_EUNSUPPORTED, "this libdsopt has no CUDA code for device " + std::to_string(device) +
                                 " (sm_" + arch +
                                 "); rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + arch);
  }
  cuda_check(probe, "cudaFuncGetAttributes");
  return std::make_unique<CudaKernels>(device, static_cast<cudaStream_t>(stream));
}

// Does not touch the driver (no device query): a process may call
// dsopt_build_info() and fork afterwards.
std::string cuda_build_info() { return "cuda=" + runtime_version_text(); }

}  // namespace dsopt
