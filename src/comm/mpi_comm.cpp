// Comm over a caller's MPI communicator, built as libdsopt_mpi (the only
// part of dsopt linked to MPI), which libdsopt loads on the first
// dsopt_comm_create_mpi (comm/mpi_loader.cpp). MPI sees host memory: device
// buffers are staged through pinned host memory unless the caller declared
// its MPI CUDA-aware.
// C bindings only (mpi.h pulls in the deprecated C++ bindings otherwise).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.hpp"
#include "comm/scratch.hpp"
#include "comm/comm.hpp"
#include "comm/mpi_plugin.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace {

MPI_Datatype mpi_type(Elem e) {
  switch (e) {
    case Elem::F32: return MPI_FLOAT;
    case Elem::F64: return MPI_DOUBLE;
    case Elem::I32: return MPI_INT32_T;
    case Elem::I64: return MPI_INT64_T;
    case Elem::U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(DSOPT_ECOMM, std::string(call) + " failed: " + std::string(text, size_t(len)));
}

// dst[i] = op(a[i], b[i]), in that order.
template <class T>
void combine_as(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (op == ReduceOp::Sum)
    for (size_t i = 0; i < n; ++i) d[i] = x[i] + y[i];
  else
    for (size_t i = 0; i < n; ++i) d[i] = std::max(x[i], y[i]);
}

void combine(void* dst, const void* a, const void* b, size_t n, Elem e, ReduceOp op) {
  switch (e) {
    case Elem::F32: return combine_as<float>(dst, a, b, n, op);
    case Elem::F64: return combine_as<double>(dst, a, b, n, op);
    case Elem::I32: return combine_as<int32_t>(dst, a, b, n, op);
    case Elem::I64: return combine_as<int64_t>(dst, a, b, n, op);
    case Elem::U8: return combine_as<uint8_t>(dst, a, b, n, op);
  }
}

// dst = fl(fl(a + b) * scale), fp32 (the scaled sum's last addition).
void combine_scaled(void* dst, const void* a, const void* b, size_t n, float scale) {
  float* d = static_cast<float*>(dst);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) d[i] = (x[i] + y[i]) * scale;
}

int as_int_count(size_t n, const char* call) {
  if (n > size_t(INT_MAX))
    fail(DSOPT_EUNSUPPORTED, std::string(call) + ": more than 2^31-1 elements in one block");
  return int(n);
}

class MpiComm;

// MPI_Ialltoall / MPI_Iallgather in flight (MpiComm::do_start_*).
class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MpiComm& comm, const char* call) : comm_(comm), call_(call) {}
  ~MpiRequest() override;
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;
  MPI_Request* handle() { return &request_; }
  bool test() override;
  void wait() override;

 private:
  MpiComm& comm_;
  const char* call_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiComm final : public Comm {
  friend class MpiRequest;

 public:
  // Collectives run on a duplicate of the caller's communicator (its own
  // message space) whose error handler returns error codes, so a failing
  // MPI call becomes DSOPT_ECOMM instead of aborting the caller's process;
  // the caller's communicator and its error handler are left as they are.
  // The duplicate is made by the first collective dsopt call (prepare()),
  // so creating the dsopt_comm stays local.
  explicit MpiComm(MPI_Comm caller) : caller_(caller), comm_(caller) {
    check_mpi(MPI_Comm_rank(caller_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(caller_, &size_), "MPI_Comm_size");
  }
  // A communicator dsopt made (split()): its own, freed with it, already
  // returning error codes.
  struct Owned {};
  MpiComm(MPI_Comm own, Owned) : caller_(own), comm_(own), owned_(true) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiComm() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    // Not after MPI_Finalize (which freed it). After a failed call MPI
    // defers the deallocation until the operations still posted complete.
    if ((comm_ != caller_ || owned_) && !finalized) MPI_Comm_free(&comm_);
  }
  void prepare() override {
    if (comm_ != caller_ || owned_) return;
    MPI_Comm dup = MPI_COMM_NULL;
    check_mpi(MPI_Comm_dup(caller_, &dup), "MPI_Comm_dup");
    const int rc = MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&dup);
      check_mpi(rc, "MPI_Comm_set_errhandler");
    }
    comm_ = dup;
  }
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  bool overlaps(const Mem& mem) const override {
    return !mem.on_device() || mem.cuda_aware;
  }
  bool concurrent_calls() const override {
    int provided = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&provided) == MPI_SUCCESS && provided == MPI_THREAD_MULTIPLE;
  }

  // The lowest rank of MPI_Comm_split_type(MPI_COMM_TYPE_SHARED): the
  // ranks that share memory with this one.
  int node_id() override {
    prepare();
    usable();
    MPI_Comm shared = MPI_COMM_NULL;
    ok(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared),
       "MPI_Comm_split_type");
    int lowest = rank_;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, shared);
    MPI_Comm_free(&shared);
    ok(rc, "MPI_Allreduce");
    return lowest;
  }

 protected:
  std::unique_ptr<Comm> do_split(int color, int key) override {
    prepare();
    usable();
    MPI_Comm sub = MPI_COMM_NULL;
    ok(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    const int rc = MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    if (rc != MPI_SUCCESS) {
      MPI_Comm_free(&sub);
      check_mpi(rc, "MPI_Comm_set_errhandler");
    }
    try {
      return std::make_unique<MpiComm>(sub, Owned{});
    } catch (...) {
      MPI_Comm_free(&sub);
      throw;
    }
  }

  void do_allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                    const Mem& mem) override {
    usable();
    const size_t es = elem_size(e), bytes = count * es;
    const bool in_place = send == recv;
    HostPair h = stage(mem, send, bytes, recv, in_place ? 0 : bytes);
    if (in_place) h.out = h.in;
    const size_t chunk = size_t(INT_MAX) / 2;
    for (size_t off = 0; off < count; off += chunk) {
      const size_t n = std::min(chunk, count - off);
      char* r = static_cast<char*>(h.out) + off * es;
      const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(h.in) + off * es;
      run("MPI_Allreduce", [&] { return MPI_Allreduce(s, r, int(n), mpi_type(e), mpi_op(op), comm_); },
          [&](MPI_Request* q) { return MPI_Iallreduce(s, r, int(n), mpi_type(e), mpi_op(op), comm_, q); });
    }
    unstage(mem, h, recv, bytes);
  }

  void do_reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                         const Mem& mem) override {
    usable();
    const size_t es = elem_size(e);
    HostPair h = stage(mem, send, count * es * size_t(size_), recv, count * es);
    if (count * es >= kRingBlockBytes && size_ > 1) {
      ring_reduce_scatter(h.in, h.out, Blocks{count, count * size_t(size_)}, e, op);
    } else {
      const int n = as_int_count(count, "reduce_scatter");
      run("MPI_Reduce_scatter_block",
          [&] { return MPI_Reduce_scatter_block(h.in, h.out, n, mpi_type(e), mpi_op(op), comm_); },
          [&](MPI_Request* q) {
            return MPI_Ireduce_scatter_block(h.in, h.out, n, mpi_type(e), mpi_op(op), comm_, q);
          });
    }
    unstage(mem, h, recv, count * es);
  }

  // Host float sums: the ring at every block size (its order is the fixed
  // one of comm.hpp, with two blocks of scratch where the alltoall form
  // needs P).
  void do_ordered_reduce_scatter(const void* send, void* recv, size_t count, Elem e,
                                 const Mem&, float scale) override {
    usable();
    ring_reduce_scatter(send, recv, Blocks{count, count * size_t(size_)}, e, ReduceOp::Sum,
                        e == Elem::F32 ? scale : 1.0f);
  }

  // The ring straight on the caller's buffers (no padding), then the
  // blocks gathered in place.
  void do_ordered_allreduce(const void* send, void* recv, size_t count, Elem e,
                            const Mem&) override {
    usable();
    const Blocks blocks{(count + size_t(size_) - 1) / size_t(size_), count};
    const size_t es = elem_size(e);
    ring_reduce_scatter(send, static_cast<char*>(recv) + blocks.first(rank_) * es, blocks, e,
                        ReduceOp::Sum);
    std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    for (int b = 0; b < size_; ++b) {
      counts[size_t(b)] = as_int_count(blocks.length(b), "allreduce");
      displs[size_t(b)] = as_int_count(blocks.first(b), "allreduce");
    }
    run("MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts.data(),
                                displs.data(), mpi_type(e), comm_);
        },
        [&](MPI_Request* q) {
          return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, counts.data(),
                                 displs.data(), mpi_type(e), comm_, q);
        });
  }

  // From this block size on, reduce-scatter runs as a ring of P-1
  // MPI_Sendrecv steps: each rank sends (P-1)/P of the data, evenly, where
  // some MPI libraries (Open MPI 4.1 at 4 ranks) reduce every block on one
  // rank and scatter it. Block b is summed in the fixed order
  // x[b+1] + x[b+2] + ... + x[b] (ranks mod P).
  static constexpr size_t kRingBlockBytes = 64 * 1024;

  // Block b of a buffer of `total` elements: [b * size, min((b + 1) * size,
  // total)), empty past the end.
  struct Blocks {
    size_t size, total;
    size_t first(int b) const { return std::min(total, size_t(b) * size); }
    size_t length(int b) const { return std::min(total, size_t(b + 1) * size) - first(b); }
  };

  // out (blocks.length(rank_) elements) = the sum over ranks of block
  // rank_ of `in`. May be called with out inside `in`, at block rank_: it is
  // written only by the last step, element by element from the same
  // element of `in`.
  void ring_reduce_scatter(const void* in, void* out, const Blocks& blocks, Elem e, ReduceOp op,
                           float scale = 1.0f) {
    const size_t es = elem_size(e);
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const auto block = [&](int b) { return static_cast<const char*>(in) + blocks.first(b) * es; };
    // The partial sum travels in `partial`, the incoming one arrives in
    // `incoming` (the last one in `out` itself where `out` is not part of
    // `in`: fl(incoming + own) is the same sum there); freed on return
    // (like an MPI library's temporaries), never filled before use.
    const char* in_begin = static_cast<const char*>(in);
    const char* out_begin = static_cast<const char*>(out);
    const bool into_out = out_begin + blocks.length(rank_) * es <= in_begin ||
                          in_begin + blocks.total * es <= out_begin;
    const size_t scratch = blocks.size * es;
    Scratch incoming(size_ > 2 || !into_out ? scratch : 0), partial(size_ > 2 ? scratch : 0);
    for (int s = 0; s < size_ - 1; ++s) {
      const int sent = (rank_ + 2 * size_ - 1 - s) % size_;  // next's block of this step
      const int b = (rank_ + 2 * size_ - 2 - s) % size_;     // the block that comes in
      const bool last = s == size_ - 2;
      const void* outgoing = s == 0 ? static_cast<const void*>(block(sent)) : partial.data();
      void* arrival = last && into_out ? out : incoming.data();
      const int out_n = as_int_count(blocks.length(sent), "reduce_scatter");
      const int in_n = as_int_count(blocks.length(b), "reduce_scatter");
      try {
        run("MPI_Sendrecv",
            [&] {
              return MPI_Sendrecv(outgoing, out_n, mpi_type(e), next, kRingTag, arrival, in_n, mpi_type(e), prev,
                                  kRingTag, comm_, MPI_STATUS_IGNORE);
            },
            [&](MPI_Request* q) {
              const int rc = MPI_Irecv(arrival, in_n, mpi_type(e), prev, kRingTag, comm_, q);
              return rc != MPI_SUCCESS ? rc
                                       : MPI_Isend(outgoing, out_n, mpi_type(e), next, kRingTag, comm_, q + 1);
            },
            2);
      } catch (...) {  // MPI may still use them
        quarantine(std::move(incoming));
        quarantine(std::move(partial));
        throw;
      }
      if (last && scale != 1.0f)  // an fp32 sum (do_ordered_reduce_scatter)
        combine_scaled(out, arrival, block(b), blocks.length(b), scale);
      else
        combine(last ? out : partial.data(), arrival, block(b), blocks.length(b), e, op);
    }
  }
  static constexpr int kRingTag = 0x5a52;  // "ZR"

  void do_allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) override {
    usable();
    const size_t es = elem_size(e);
    HostPair h = stage(mem, send, count * es, recv, count * es * size_t(size_));
    const int n = as_int_count(count, "allgather");
    run("MPI_Allgather",
        [&] { return MPI_Allgather(h.in, n, mpi_type(e), h.out, n, mpi_type(e), comm_); },
        [&](MPI_Request* q) {
          return MPI_Iallgather(h.in, n, mpi_type(e), h.out, n, mpi_type(e), comm_, q);
        });
    unstage(mem, h, recv, count * es * size_t(size_));
  }

  void do_alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                    void* recv, const size_t* recv_counts, const size_t* recv_offsets, Elem e,
                    const Mem& mem) override {
    usable();
    const size_t es = elem_size(e);
    std::vector<int> sc(size_), so(size_), rc(size_), ro(size_);
    size_t send_extent = 0, recv_extent = 0;
    for (int j = 0; j < size_; ++j) {
      sc[j] = as_int_count(send_counts[j], "alltoallv");
      so[j] = as_int_count(send_offsets[j], "alltoallv");
      rc[j] = as_int_count(recv_counts[j], "alltoallv");
      ro[j] = as_int_count(recv_offsets[j], "alltoallv");
      send_extent = std::max(send_extent, send_offsets[j] + send_counts[j]);
      recv_extent = std::max(recv_extent, recv_offsets[j] + recv_counts[j]);
    }
    HostPair h = stage(mem, send, send_extent * es, recv, recv_extent * es);
    run("MPI_Alltoallv",
        [&] {
          return MPI_Alltoallv(h.in, sc.data(), so.data(), mpi_type(e), h.out, rc.data(), ro.data(),
                               mpi_type(e), comm_);
        },
        [&](MPI_Request* q) {
          return MPI_Ialltoallv(h.in, sc.data(), so.data(), mpi_type(e), h.out, rc.data(),
                                ro.data(), mpi_type(e), comm_, q);
        });
    unstage(mem, h, recv, recv_extent * es);
  }

  std::unique_ptr<CommRequest> do_start_alltoall(const void* send, void* recv, size_t count, Elem e,
                                                 const Mem& mem) override {
    return start(MPI_Ialltoall, "MPI_Ialltoall", send, recv, count, e, mem);
  }

  std::unique_ptr<CommRequest> do_start_allgather(const void* send, void* recv, size_t count,
                                                  Elem e, const Mem& mem) override {
    return start(MPI_Iallgather, "MPI_Iallgather", send, recv, count, e, mem);
  }

 private:
  // MPI_Ialltoall and MPI_Iallgather (the same signature): count elements
  // to and from every rank, on buffers MPI can use directly.
  using StartFn = int (*)(const void*, int, MPI_Datatype, void*, int, MPI_Datatype, MPI_Comm,
                          MPI_Request*);
  std::unique_ptr<CommRequest> start(StartFn fn, const char* call, const void* send, void* recv,
                                     size_t count, Elem e, const Mem& mem) {
    if (!overlaps(mem)) return nullptr;
    usable();
    auto r = std::make_unique<MpiRequest>(*this, call);
    const int n = as_int_count(count, call);
    ok(fn(send, n, mpi_type(e), recv, n, mpi_type(e), comm_, r->handle()), call);
    return r;
  }

  // Host pointers MPI works on: the buffers themselves, or regions of the
  // staging memory (input copied in) when they live on a device.
  struct HostPair {
    void* in;  // not written through, except by in-place collectives
    void* out;
    bool staged;
  };
  HostPair stage(const Mem& mem, const void* in, size_t in_bytes, void* out, size_t out_bytes) {
    if (!mem.on_device() || mem.cuda_aware) return {const_cast<void*>(in), out, false};
    char* s = static_cast<char*>(mem.kernels->host_staging(in_bytes + out_bytes));
    if (in_bytes) mem.kernels->copy_to_host(s, in, in_bytes);
    return {s, s + in_bytes, true};
  }
  static void unstage(const Mem& mem, const HostPair& h, void* out, size_t out_bytes) {
    if (h.staged && out_bytes) mem.kernels->copy_from_host(out, h.out, out_bytes);
  }

  // After a failed call MPI may still have operations of it posted (Open
  // MPI returns a failed send with its receive still posted, and completes
  // it during a later MPI call): the communicator is not used again, and
  // dsopt's own buffers of that call are never freed.
  void ok(int rc, const char* call) {
    if (rc != MPI_SUCCESS) failed_ = true;
    check_mpi(rc, call);
  }
  // One MPI operation: the blocking call, or with "comm_timeout" its
  // nonblocking form (posting `requests` requests) waited for with a limit.
  template <class Blocking, class Nonblocking>
  void run(const char* call, Blocking blocking, Nonblocking nonblocking, int requests = 1) {
    if (timeout() <= 0) {
      ok(blocking(), call);
      return;
    }
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    ok(nonblocking(q), call);
    wait_for(q, requests, call);
  }
  // Waits for `n` requests; with "comm_timeout" a wait longer than the
  // timeout fails the communicator with DSOPT_ECOMM. MPI cannot cancel a
  // collective: the operations stay posted, and may still write their
  // receive buffers if the missing rank arrives later.
  void wait_for(MPI_Request* q, int n, const char* call) {
    if (timeout() <= 0) {
      ok(MPI_Waitall(n, q, MPI_STATUSES_IGNORE), call);
      return;
    }
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout()));
    for (int polls = 0;; ++polls) {
      int done = 0;
      ok(MPI_Testall(n, q, &done, MPI_STATUSES_IGNORE), call);
      if (done) return;
      if (Clock::now() > deadline) {
        failed_ = true;
        char limit[32];
        std::snprintf(limit, sizeof limit, "%g", timeout());
        fail(DSOPT_ECOMM, std::string(call) + " did not complete within comm_timeout = " + limit +
                              " s: a rank has died, is stuck, or is in another call. dsopt does not "
                              "use this communicator again; MPI cannot cancel the call, so its "
                              "buffers may still be written: end the process (or MPI_Abort) "
                              "rather than go on with the memory given to it");
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  void usable() const {
    if (failed_)
      fail(DSOPT_ECOMM, "an earlier MPI call on this communicator failed (see its error); dsopt "
                        "does not use it again: create a new communicator");
  }
  bool failed_ = false;
  // Keeps a failed call's buffer for the life of the process (reachable,
  // so leak checkers do not count it).
  static void quarantine(Scratch&& buffer) {
    static std::mutex mutex;
    static auto* kept = new std::vector<Scratch>();
    std::lock_guard<std::mutex> lock(mutex);
    kept->push_back(std::move(buffer));
  }

  MPI_Comm caller_;  // borrowed (dsopt's own when owned_)
  MPI_Comm comm_;    // the duplicate once prepare() ran, the caller's before
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

bool MpiRequest::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  comm_.ok(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), call_);
  return done != 0;
}

void MpiRequest::wait() {
  if (request_ != MPI_REQUEST_NULL) comm_.wait_for(&request_, 1, call_);
}

// Unwinding past a request in flight (another call failed): it still uses
// its buffers, so wait for it unless the communicator already failed (then
// nothing completes it; MPI may still write the buffers, see ok()).
MpiRequest::~MpiRequest() {
  if (request_ != MPI_REQUEST_NULL && !comm_.failed_) (void)MPI_Wait(&request_, MPI_STATUS_IGNORE);
}

}  // namespace

static std::unique_ptr<Comm> make_mpi_comm_here(int64_t fortran_handle) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    fail(DSOPT_EINVAL, "MPI is not initialised (call MPI_Init before dsopt_comm_create_mpi)");
  if (fortran_handle < 0 || fortran_handle > INT_MAX)
    fail(DSOPT_EINVAL, "MPI handle " + std::to_string(fortran_handle) + " is not a communicator");
  MPI_Comm c = MPI_Comm_f2c(MPI_Fint(fortran_handle));
  if (c == nullptr || c == MPI_COMM_NULL)
    fail(DSOPT_EINVAL, "MPI handle " + std::to_string(fortran_handle) +
                           " is not a communicator (expected MPI_Comm_c2f(comm) or comm.py2f())");
  return std::make_unique<MpiComm>(c);
}

}  // namespace dsopt

// ---- the plugin's entry points (comm/mpi_plugin.hpp) -----------------------

extern "C" {

DSOPT_MPI_PLUGIN_EXPORT const char* dsopt_mpi_plugin_abi(void) { return dsopt::kMpiPluginAbi; }

DSOPT_MPI_PLUGIN_EXPORT dsopt::Comm* dsopt_mpi_plugin_create(int64_t fortran_handle, int* status,
                                                             char* message, size_t capacity) {
  try {
    *status = DSOPT_OK;
    return dsopt::make_mpi_comm_here(fortran_handle).release();
  } catch (const dsopt::Error& e) {
    *status = e.status();
    std::snprintf(message, capacity, "%s", e.what());
  } catch (const std::exception& e) {
    *status = DSOPT_EINTERNAL;
    std::snprintf(message, capacity, "%s", e.what());
  }
  return nullptr;
}

DSOPT_MPI_PLUGIN_EXPORT void dsopt_mpi_plugin_library_version(char* out, size_t capacity) {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  std::string v(version, size_t(len));
  const size_t cut = v.find_first_of(",\n");
  std::snprintf(out, capacity, "%s", (cut == std::string::npos ? v : v.substr(0, cut)).c_str());
}
}
