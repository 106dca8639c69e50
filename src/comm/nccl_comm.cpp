// NcclComm: Comm over a caller's NCCL communicator. Every collective is
// queued on the caller's stream. Device buffers (CUDA kernels) go to NCCL
// as they are; host buffers (CPU kernels: small control messages such as
// config hashes and flags) are staged through a device scratch buffer and
// the stream is synchronized before the call returns.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "comm/nccl_loader.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace {

void cuda_ok(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(err == cudaErrorMemoryAllocation ? DSOPT_ENOMEM : DSOPT_ECUDA,
       std::string(call) + ": " + cudaGetErrorString(err));
}

ncclDataType_t nccl_type(Elem e) {
  switch (e) {
    case Elem::F32: return ncclFloat32;
    case Elem::F64: return ncclFloat64;
    case Elem::I32: return ncclInt32;
    case Elem::I64: return ncclInt64;
    case Elem::U8: return ncclUint8;
  }
  fail(DSOPT_EINTERNAL, "nccl: unknown element type");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
  }
  fail(DSOPT_EINTERNAL, "nccl: unknown reduction");
}

bool on_device(const Mem& mem) {
  return mem.on_device();
}

// Makes the communicator's device current for one call.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cuda_ok(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, cudaStream_t stream) : api_(nccl_api()), comm_(comm), stream_(stream) {
    check(api_.comm_count(comm_, &size_), "ncclCommCount");
    check(api_.comm_user_rank(comm_, &rank_), "ncclCommUserRank");
    check(api_.comm_cu_device(comm_, &device_), "ncclCommCuDevice");
  }

  ~NcclComm() override {
    if (scratch_ == nullptr && !owned_) return;
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != device_) (void)cudaSetDevice(device_);
    (void)cudaStreamSynchronize(stream_);
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    // A communicator split() made is dsopt's (an aborted one is freed already).
    if (owned_ && !aborted_) (void)api_.comm_destroy(comm_);
    if (previous >= 0 && previous != device_) (void)cudaSetDevice(previous);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  void* cuda_stream() const override { return stream_; }
  void wait() override {
    DeviceScope scope(device_);
    finish();
  }

 protected:
  // NCCL's own order, host buffers staged through the device included.
  bool orders_host_sums() const override { return false; }

  // ncclCommSplit, on the same device and stream; freed with the Comm.
  std::unique_ptr<Comm> do_split(int color, int key) override {
    if (api_.comm_split == nullptr)
      fail(DSOPT_EUNSUPPORTED,
           "the loaded NCCL (version code " + std::to_string(api_.version) +
               ") has no ncclCommSplit: splitting a communicator into node and rail "
               "communicators needs NCCL >= 2.18; give dsopt the node and rail communicators "
               "yourself, or use the flat compressed allreduce");
    if (aborted_) fail(DSOPT_ECOMM, "the NCCL communicator was aborted by an earlier error or timeout: " + aborted_why_);
    DeviceScope scope(device_);
    ncclComm_t sub = nullptr;
    check(api_.comm_split(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    std::unique_ptr<NcclComm> made;
    try {
      made = std::make_unique<NcclComm>(sub, stream_);
    } catch (...) {
      (void)api_.comm_destroy(sub);
      throw;
    }
    made->owned_ = true;
    return made;
  }

  void do_allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                    const Mem& mem) override {
    if (count == 0) return;
    DeviceScope scope(device_);
    if (on_device(mem)) {
      check(api_.all_reduce(send, recv, count, nccl_type(e), nccl_op(op), comm_, stream_),
            "ncclAllReduce");
      return;
    }
    const size_t bytes = count * elem_size(e);
    char* s = scratch(bytes);
    to_device(s, send, bytes);
    check(api_.all_reduce(s, s, count, nccl_type(e), nccl_op(op), comm_, stream_),
          "ncclAllReduce");
    to_host(recv, s, bytes);
    finish();
  }

  void do_reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                         const Mem& mem) override {
    if (count == 0) return;
    DeviceScope scope(device_);
    if (on_device(mem)) {
      check(api_.reduce_scatter(send, recv, count, nccl_type(e), nccl_op(op), comm_, stream_),
            "ncclReduceScatter");
      return;
    }
    const size_t block = count * elem_size(e);
    char* s = scratch(block * size_t(size_));
    to_device(s, send, block * size_t(size_));
    char* mine = s + block * size_t(rank_);  // NCCL's in-place layout
    check(api_.reduce_scatter(s, mine, count, nccl_type(e), nccl_op(op), comm_, stream_),
          "ncclReduceScatter");
    to_host(recv, mine, block);
    finish();
  }

  void do_allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) override {
    if (count == 0) return;
    DeviceScope scope(device_);
    if (on_device(mem)) {
      check(api_.all_gather(send, recv, count, nccl_type(e), comm_, stream_), "ncclAllGather");
      return;
    }
    const size_t block = count * elem_size(e);
    char* s = scratch(block * size_t(size_));
    char* mine = s + block * size_t(rank_);  // NCCL's in-place layout
    to_device(mine, send, block);
    check(api_.all_gather(mine, s, count, nccl_type(e), comm_, stream_), "ncclAllGather");
    to_host(recv, s, block * size_t(size_));
    finish();
  }

  void do_alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                    void* recv, const size_t* recv_counts, const size_t* recv_offsets, Elem e,
                    const Mem& mem) override {
    DeviceScope scope(device_);
    const size_t es = elem_size(e);
    const ncclDataType_t type = nccl_type(e);
    if (on_device(mem)) {
      exchange(static_cast<const char*>(send), send_counts, send_offsets,
               static_cast<char*>(recv), recv_counts, recv_offsets, es, type);
      return;
    }
    size_t send_extent = 0, recv_extent = 0;  // elements
    for (int r = 0; r < size_; ++r) {
      if (send_counts[r] > 0) send_extent = std::max(send_extent, send_offsets[r] + send_counts[r]);
      if (recv_counts[r] > 0) recv_extent = std::max(recv_extent, recv_offsets[r] + recv_counts[r]);
    }
    if (send_extent == 0 && recv_extent == 0) return;
    char* s = scratch((send_extent + recv_extent) * es);
    char* s_recv = s + send_extent * es;
    to_device(s, send, send_extent * es);
    exchange(s, send_counts, send_offsets, s_recv, recv_counts, recv_offsets, es, type);
    // Block by block: parts of recv between blocks stay as they were.
    for (int r = 0; r < size_; ++r)
      if (recv_counts[r] > 0)
        to_host(static_cast<char*>(recv) + recv_offsets[r] * es, s_recv + recv_offsets[r] * es,
                recv_counts[r] * es);
    finish();
  }

 private:
  void check(ncclResult_t r, const char* call) const {
    if (r == ncclSuccess) return;
    std::string msg = std::string(call) + ": " + api_.get_error_string(r);
    if (api_.get_last_error != nullptr) {
      const char* detail = api_.get_last_error(comm_);
      if (detail != nullptr && detail[0] != '\0') msg += std::string(" (") + detail + ")";
    }
    fail(DSOPT_ECOMM, msg);
  }

  // One grouped send/recv per peer (zero counts included, so both sides of
  // every pair post matching calls).
  void exchange(const char* send, const size_t* send_counts, const size_t* send_offsets,
                char* recv, const size_t* recv_counts, const size_t* recv_offsets, size_t es,
                ncclDataType_t type) {
    check(api_.group_start(), "ncclGroupStart");
    ncclResult_t first = ncclSuccess;
    const char* first_call = "";
    for (int r = 0; r < size_ && first == ncclSuccess; ++r) {
      ncclResult_t s = api_.send(send + send_offsets[r] * es, send_counts[r], type, r, comm_, stream_);
      if (s != ncclSuccess) {
        first = s;
        first_call = "ncclSend";
        break;
      }
      s = api_.recv(recv + recv_offsets[r] * es, recv_counts[r], type, r, comm_, stream_);
      if (s != ncclSuccess) {
        first = s;
        first_call = "ncclRecv";
      }
    }
    const ncclResult_t end = api_.group_end();  // always closes the group
    check(first, first_call);
    check(end, "ncclGroupEnd");
  }

  // Device scratch of at least `bytes`. Only the host-staged paths use it,
  // and they finish() before returning, so nothing queued still reads it.
  char* scratch(size_t bytes) {
    if (bytes > scratch_size_) {
      if (scratch_ != nullptr) {
        cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        (void)cudaFree(scratch_);
        scratch_ = nullptr;
        scratch_size_ = 0;
      }
      void* p = nullptr;
      cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
      scratch_ = static_cast<char*>(p);
      scratch_size_ = bytes;
    }
    return scratch_;
  }

  void to_device(void* dst, const void* src_host, size_t bytes) {
    if (bytes == 0) return;
    cuda_ok(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, stream_),
            "cudaMemcpyAsync");
  }
  void to_host(void* dst_host, const void* src, size_t bytes) {
    if (bytes == 0) return;
    cuda_ok(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync");
  }
  // Waits for the stream, polling NCCL for asynchronous errors (a peer
  // that died, a network failure) and, with a timeout, for a collective
  // that never completes (a rank that never joined). Either aborts the
  // NCCL communicator (its queued work can never finish) and fails with
  // DSOPT_ECOMM, instead of blocking for ever.
  void finish() {
    if (aborted_) fail(DSOPT_ECOMM, "the NCCL communicator was aborted by an earlier error or timeout: " + aborted_why_);
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_ok(q, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      check(api_.comm_get_async_error(comm_, &async), "ncclCommGetAsyncError");
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const bool timed_out = timeout() > 0 && waited > timeout();
      if (async != ncclSuccess || timed_out) {
        aborted_why_ = async != ncclSuccess
                           ? std::string("asynchronous NCCL error: ") + api_.get_error_string(async)
                           : "a collective did not complete within comm_timeout = " +
                                 std::to_string(timeout()) + " s (a rank that never joined?)";
        aborted_ = true;
        (void)api_.comm_abort(comm_);
        fail(DSOPT_ECOMM, aborted_why_ + "; the NCCL communicator was aborted: create a new one");
      }
      if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  const NcclApi& api_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = 0, size_ = 0, device_ = 0;
  char* scratch_ = nullptr;
  size_t scratch_size_ = 0;
  bool aborted_ = false;
  bool owned_ = false;  // made by split(): destroyed with this object
  std::string aborted_why_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(void* nccl_comm, void* cuda_stream) {
  if (nccl_comm == nullptr) fail(DSOPT_EINVAL, "NCCL communicator is NULL");
  return std::make_unique<NcclComm>(static_cast<ncclComm_t>(nccl_comm),
                                    static_cast<cudaStream_t>(cuda_stream));
}

}  // namespace dsopt
