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
#include "kernels/device_pointer.hpp"
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

// Host data for kernels (constants, metadata), uploaded through a pinned
// buffer by an asynchronous copy on the stream. The pinned buffer is reused
// only after the previous copy has left it, so the caller's host arrays may
// change as soon as the call that uploaded them returns.
class Upload {
 public:
  explicit Upload(cudaStream_t stream) : host_(true, stream), dev_(false, stream), stream_(stream) {}
  ~Upload() { release(); }
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  // The pinned buffer to fill (at least `bytes`), free to overwrite.
  void* host(size_t bytes) {
    if (pending_) {
      DSOPT_CUDA_CHECK(cudaEventSynchronize(copied_));
      pending_ = false;
    }
    if (copied_ == nullptr) DSOPT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
    bytes_ = bytes;
    return host_.get(bytes);
  }

  // Queues the copy of what host() returned to device memory; returns it.
  void* send() {
    void* dev = dev_.get(bytes_);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dev, host_.get(bytes_), bytes_, cudaMemcpyHostToDevice, stream_));
    DSOPT_CUDA_CHECK(cudaEventRecord(copied_, stream_));
    pending_ = true;
    return dev;
  }

  void release() {
    if (copied_ != nullptr) (void)cudaEventDestroy(copied_);
    copied_ = nullptr;
    pending_ = false;
    host_.release();
    dev_.release();
  }

 private:
  Workspace host_, dev_;
  cudaStream_t stream_;
  cudaEvent_t copied_ = nullptr;
  bool pending_ = false;
  size_t bytes_ = 0;
};

class CudaKernels final : public Kernels {
 public:
  CudaKernels(int device, cudaStream_t stream)
      : device_(device),
        stream_(stream),
        consts_(stream),
        car_meta_(stream),
        sums_dev_(false, stream),
        sums_host_(true, stream),
        flag_dev_(false, stream),
        flag_host_(true, stream),
        max_dev_(false, stream),
        max_host_(true, stream),
        staging_host_(true, stream) {}

  ~CudaKernels() override {
    DeviceGuardNoThrow guard(device_);
    (void)cudaStreamSynchronize(stream_);
    consts_.release();
    car_meta_.release();
    for (Workspace* w : {&sums_dev_, &sums_host_, &flag_dev_, &flag_host_, &max_dev_, &max_host_,
                       &staging_host_})
      w->release();
    for (cudaEvent_t e : lane_done_)
      if (e != nullptr) (void)cudaEventDestroy(e);
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

  void pin(void* host, size_t bytes) override {
    if (host == nullptr || bytes == 0) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaHostRegister(host, bytes, cudaHostRegisterDefault));
  }

  void unpin(void* host) override {
    if (host == nullptr) return;
    DeviceGuardNoThrow guard(device_);
    (void)cudaHostUnregister(host);
  }

  void copy_from_host_async(void* dst, const void* src_host, size_t bytes, int lane) override {
    if (bytes == 0) return;
    DeviceGuard guard(device_);
    cudaEvent_t& done = lane_done_[lane & 1];
    if (done == nullptr) DSOPT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, stream_));
    DSOPT_CUDA_CHECK(cudaEventRecord(done, stream_));
  }

  void wait_lane(int lane) override {
    cudaEvent_t done = lane_done_[lane & 1];
    if (done == nullptr) return;
    DeviceGuard guard(device_);
    DSOPT_CUDA_CHECK(cudaEventSynchronize(done));
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

  void codec_encode(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
                    uint8_t* e_out, int64_t n, int runs, uint8_t* out) override {
    DeviceGuard guard(device_);
    cuda::launch_codec_encode(stream_, c, block, g, e_in, e_mul, e_out, n, runs, out);
  }

  void codec_decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n,
                        float* dst) override {
    DeviceGuard guard(device_);
    cuda::launch_codec_decode_sum(stream_, c, block, in, runs, n, dst);
  }

  GradStats transform(const TensorRef* src, int64_t count, float mul, float* dst,
                      double* sumsq_host) override {
    return pass(src, count, mul, dst, false, sumsq_host);
  }

  GradStats accumulate(const TensorRef* src, int64_t count, float* dst) override {
    return pass(src, count, 1.0f, dst, true, nullptr);
  }

  GradStats pass(const TensorRef* src, int64_t count, float mul, float* dst, bool add,
                 double* sumsq_host) {
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
    cuda::launch_transform(stream_, src, count, mul, dst, add, sums_dev, flag_dev);
    DSOPT_CUDA_CHECK(
        cudaMemcpyAsync(flag_host, flag_dev, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    if (sums_dev != nullptr)
      DSOPT_CUDA_CHECK(cudaMemcpyAsync(sums_host, sums_dev, size_t(total_blocks) * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream_));
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));

    stats.nonfinite = *flag_host != 0;
    if (sumsq_host != nullptr)
      add_block_sums(sums_host, count, [&](int64_t i) { return src[i].numel; }, sumsq_host);
    return stats;
  }

  void update_records(UpdateRule rule, const UpdateSlot* slots, int64_t count, const void* consts,
                      int32_t num_groups, float mul1, float mul2) override {
    if (count <= 0) return;
    if (num_groups <= 0) fail(DSOPT_EINTERNAL, "update: no parameter groups");
    for (int64_t i = 0; i < count; ++i)
      if (slots[i].group < 0 || slots[i].group >= num_groups)
        fail(DSOPT_EINTERNAL, "update: slot group out of range");
    DeviceGuard guard(device_);
    const size_t bytes = size_t(num_groups) * rule_consts_bytes(rule);
    std::memcpy(consts_.host(bytes), consts, bytes);
    cuda::launch_update(stream_, rule, slots, count, consts_.send(), mul1, mul2);
  }

  void max_per_tensor(const TensorRef* src, int64_t count, float* max_host) override {
    if (count <= 0) return;
    DeviceGuard guard(device_);
    const size_t bytes = size_t(count) * sizeof(unsigned);
    auto* out_dev = static_cast<unsigned*>(max_dev_.get(bytes));
    auto* out_host = static_cast<unsigned*>(max_host_.get(bytes));
    DSOPT_CUDA_CHECK(cudaMemsetAsync(out_dev, 0, bytes, stream_));
    cuda::launch_max_per_tensor(stream_, src, count, out_dev);
    DSOPT_CUDA_CHECK(cudaMemcpyAsync(out_host, out_dev, bytes, cudaMemcpyDeviceToHost, stream_));
    DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::memcpy(max_host, out_host, bytes);
  }

  // ---- compressed allreduce ------------------------------------------------

  void car_worker_sumsq(const CarTensor* t, int64_t count, double* sumsq_host) override {
    car_run(cuda::CarOp::WorkerSumsq, t, count, 1, nullptr, nullptr, 0, nullptr, nullptr, 0,
            sumsq_host);
  }

  void car_worker_pack(const CarTensor* t, int64_t count, int world, const float* scales_host,
                       uint8_t* send, int64_t msg_bytes) override {
    car_run(cuda::CarOp::WorkerPack, t, count, world, scales_host, nullptr, 0, nullptr, send,
            msg_bytes, nullptr);
  }

  void car_server_sum(const CarTensor* t, int64_t count, int world, const uint8_t* recv,
                      int64_t msg_bytes, const float* weights_host, double* sumsq_host) override {
    car_run(cuda::CarOp::ServerSum, t, count, world, nullptr, weights_host,
            int64_t(world) * count, recv, nullptr, msg_bytes, sumsq_host);
  }

  void car_server_pack(const CarTensor* t, int64_t count, int world, const float* scales_host,
                       uint8_t* out) override {
    car_run(cuda::CarOp::ServerPack, t, count, world, scales_host, nullptr, 0, nullptr, out, 0,
            nullptr);
  }

  void car_decode(const CarTensor* t, int64_t count, int world, const uint8_t* gathered,
                  int64_t msg_bytes, const float* scales_host) override {
    car_run(cuda::CarOp::Decode, t, count, world, nullptr, scales_host, int64_t(world) * count,
            gathered, nullptr, msg_bytes, nullptr);
  }

 private:
  // sums[i] = the block sums of tensor i (len(i) elements, sum_blocks(len(i))
  // blocks, stored after those of the tensors before it) added in block
  // order, as the CPU does (math/sum_squares.hpp).
  template <class Len>
  static void add_block_sums(const double* block_sums, int64_t count, Len len, double* sums) {
    for (int64_t i = 0; i < count; ++i) {
      double s = 0.0;
      for (int64_t k = 0, nb = sum_blocks(len(i)); k < nb; ++k) s += *block_sums++;
      sums[i] = s;
    }
  }

  // One compressed-allreduce primitive: metadata (with this rank's scales
  // and the per-sender table) uploaded, one launch; the sum primitives wait
  // for their block sums and add them up per tensor.
  void car_run(cuda::CarOp op, const CarTensor* t, int64_t count, int world,
               const float* scales_host, const float* table_host, int64_t table_len,
               const uint8_t* in, uint8_t* out, int64_t msg_bytes, double* sumsq_host) {
    if (count <= 0) return;
    if (world < 1) fail(DSOPT_EINTERNAL, "compressed allreduce: world < 1");
    if (count > 0x7FFFFFFF) fail(DSOPT_EUNSUPPORTED, "compressed allreduce: too many tensors");
    for (int64_t i = 0; i < count; ++i)
      if (t[i].padded % (int64_t(8) * world) != 0 || t[i].padded < t[i].n || t[i].n < 0)
        fail(DSOPT_EINTERNAL, "compressed allreduce: padded length not a multiple of 8 * world");
    DeviceGuard guard(device_);

    const cuda::CarMetaLayout layout = cuda::car_meta_layout(count, table_len);
    const int64_t blocks = cuda::car_write_meta(car_meta_.host(layout.bytes), op, t, count, world,
                                                scales_host, table_host, table_len);
    auto* meta = static_cast<const unsigned char*>(car_meta_.send());

    cuda::CarArgs args;
    args.items = reinterpret_cast<const cuda::CarItem*>(meta + layout.items);
    args.first = reinterpret_cast<const int64_t*>(meta + layout.first);
    args.table = reinterpret_cast<const float*>(meta + layout.table);
    args.count = static_cast<int32_t>(count);
    args.world = world;
    args.in = in;
    args.out = out;
    args.msg_bytes = msg_bytes;
    args.block_sums = nullptr;
    double* sums_host = nullptr;
    if (sumsq_host != nullptr && blocks > 0) {
      const size_t bytes = size_t(blocks) * sizeof(double);
      args.block_sums = static_cast<double*>(sums_dev_.get(bytes));
      sums_host = static_cast<double*>(sums_host_.get(bytes));
    }
    cuda::launch_car(stream_, op, args, blocks);
    if (sumsq_host == nullptr) return;
    if (sums_host != nullptr) {
      DSOPT_CUDA_CHECK(cudaMemcpyAsync(sums_host, args.block_sums, size_t(blocks) * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream_));
      DSOPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    add_block_sums(sums_host, count, [&](int64_t i) { return cuda::car_len(op, t[i], world); },
                   sumsq_host);
  }

  int device_;
  cudaStream_t stream_;
  Upload consts_;    // the rule's constants of update_records()
  Upload car_meta_;  // metadata, scales and weights of the car_* kernels
  Workspace sums_dev_, sums_host_;
  Workspace flag_dev_, flag_host_;
  Workspace max_dev_, max_host_;  // max_per_tensor
  Workspace staging_host_;  // MPI staging of device buffers
  cudaEvent_t lane_done_[2] = {nullptr, nullptr};  // copy_from_host_async's lanes
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

int cuda_device_of(const void* p) {
  if (p == nullptr) return -1;
  cudaPointerAttributes attr;
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver, no device, or not a pointer CUDA knows
    return -1;
  }
  const bool device = attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
  return device ? attr.device : -1;
}

bool is_cuda_device_pointer(const void* p) { return cuda_device_of(p) >= 0; }

int cuda_current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}


// Does not touch the driver (no device query): a process may call
// dsopt_build_info() and fork afterwards.
std::string cuda_build_info() { return "cuda=" + runtime_version_text(); }

}  // namespace dsopt
