// Collective communication for optimizers. Optimizers talk to Comm only,
// never to MPI or NCCL. Every call is collective over the communicator and
// blocking from the caller's point of view (device work is queued on the
// communicator's stream and ordered with the optimizer's kernels).
//
// Buffers live where `mem.kernels` says: host memory for CPU kernels (or
// no kernels: Mem::host()), device memory for CUDA kernels. Each implementation moves them as it must (MPI
// stages device buffers through pinned host memory unless mem.cuda_aware;
// NCCL stages host buffers through device memory).
//
// Floating-point sums over ranks on host buffers are dsopt's own, in one
// fixed order on every backend but NCCL (which keeps its own): element i of
// block b (b = 0..P-1 of a reduce-scatter; of an allreduce, elements
// [b*q, (b+1)*q) with q = ceil(n / P) of each piece of at most 2^30
// elements) is ((x[b+1] + x[b+2]) + ...) + x[b], ranks taken mod P, one
// rounding per addition. Results then do not depend on the MPI library or
// the caller's runtime behind a custom communicator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

struct dsopt_comm_ops;

namespace dsopt {

class Kernels;

enum class Elem : int32_t { F32, F64, I32, I64, U8 };
enum class ReduceOp : int32_t { Sum, Max };

size_t elem_size(Elem e);

struct Mem {
  Kernels* kernels;  // nullptr: plain host memory
  bool cuda_aware = false;
  // Host memory that no kernels object owns (small exchanges of flags and
  // sums).
  static Mem host() { return Mem{nullptr, false}; }
  bool on_device() const;  // CUDA device memory
};

// A collective started by Comm::start_alltoall or start_allgather. It is
// complete once test() has returned true or wait() has returned; until then
// its buffers must stay as they are. MPI moves bytes only inside MPI calls,
// so a caller computing meanwhile calls test() every millisecond or so.
// Destroying a request that is not complete waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// Bytes a rank sent: all of them, and those to ranks on other nodes.
struct CommBytes {
  uint64_t sent = 0;
  uint64_t inter_node = 0;

  CommBytes& operator+=(const CommBytes& o) {
    sent += o.sent;
    inter_node += o.inter_node;
    return *this;
  }
  CommBytes operator-(const CommBytes& o) const { return {sent - o.sent, inter_node - o.inter_node}; }
  CommBytes operator+(const CommBytes& o) const { return {sent + o.sent, inter_node + o.inter_node}; }
};

class Comm {
 public:
  // Unlinks the node and rail communicators given to it, or the one it was
  // given to (set_given_nodes).
  virtual ~Comm();
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;  // "local", "mpi", "nccl", "custom"
  // The CUDA stream device work on this communicator runs on (a
  // cudaStream_t; nullptr: the legacy default stream).
  virtual void* cuda_stream() const { return nullptr; }
  // Called by every rank at the start of every collective dsopt call
  // (dsopt_create first): MPI duplicates the caller's communicator here.
  virtual void prepare() {}
  // Seconds a collective may wait before failing with DSOPT_ECOMM (0: no
  // limit); set by each optimizer before its collectives (NCCL only).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  // Waits for the device work queued on this communicator, failing with
  // DSOPT_ECOMM on an asynchronous error or after the timeout (NCCL; the
  // others complete their collectives before returning).
  virtual void wait() {}
  double timeout() const { return timeout_s_; }
  // Whether collectives may be called from a thread of dsopt's own while
  // the caller's threads use the library too (MPI: MPI_THREAD_MULTIPLE).
  virtual bool concurrent_calls() const { return false; }

  // recv[i] = op over ranks of send[i], count elements. send may equal recv.
  void allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op, const Mem& mem);
  // send holds size()*count elements; rank r receives the op over ranks of
  // block r (count elements) in recv.
  void reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                      const Mem& mem);
  // reduce_scatter of an fp32 sum, then recv[i] = fl(recv[i] * scale): in
  // the last addition's pass where the sums are dsopt's fixed-order ones on
  // the host (the same bits as a pass of its own), else a pass of
  // mem.kernels after it.
  void reduce_scatter_scaled(const float* send, float* recv, size_t count, float scale, const Mem& mem);
  // recv holds size()*count elements: block r is rank r's send.
  void allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem);
  // send and recv hold size()*count elements; block j of send goes to rank j,
  // block i of recv came from rank i.
  void alltoall(const void* send, void* recv, size_t count, Elem e, const Mem& mem);
  // Variable block sizes and offsets, in elements, one per rank.
  void alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                 void* recv, const size_t* recv_counts, const size_t* recv_offsets, Elem e,
                 const Mem& mem);

  // alltoall and allgather started without waiting for them (bytes counted
  // when they start). Backends without such collectives for `mem` (local,
  // NCCL, MPI with staged device buffers) finish them before returning.
  std::unique_ptr<CommRequest> start_alltoall(const void* send, void* recv, size_t count, Elem e,
                                              const Mem& mem);
  std::unique_ptr<CommRequest> start_allgather(const void* send, void* recv, size_t count, Elem e,
                                               const Mem& mem);
  // Whether the start_* calls on buffers in `mem` return before the
  // transfer completes, so that work between test() calls overlaps it.
  virtual bool overlaps(const Mem& mem) const { (void)mem; return false; }

  // Work an optimizer left running on its thread on this communicator
  // (a deferred parameter allgather): `finish` waits for it. Another
  // optimizer's calls on the communicator first finish it (finish_others),
  // so that two threads never call collectives on it at once.
  void set_pending(const void* owner, std::function<void()> finish) {
    pending_owner_ = owner;
    pending_finish_ = std::move(finish);
  }
  void clear_pending(const void* owner) {
    if (pending_owner_ != owner) return;
    pending_owner_ = nullptr;
    pending_finish_ = nullptr;
  }
  void finish_others(const void* caller) {
    if (!pending_owner_ || pending_owner_ == caller) return;
    std::function<void()> finish = std::move(pending_finish_);
    pending_owner_ = nullptr;
    pending_finish_ = nullptr;
    finish();
  }

  // ---- sub-communicators (comm/topology.hpp) ---------------------------------
  // Collective over this communicator: the ranks that pass the same `color`
  // (>= 0) form a new communicator, ranked by `key` (ties by rank here), of
  // this one's backend, stream and timeout, with the same fixed-order sums
  // and its own bytes_sent. Owned by the caller; it must not outlive this
  // one. MPI: MPI_Comm_split; NCCL: ncclCommSplit (NCCL >= 2.18, else
  // DSOPT_EUNSUPPORTED); local: another world of one; custom callbacks:
  // DSOPT_EUNSUPPORTED (dsopt cannot make communicators out of the caller's
  // callbacks: the caller gives the node and rail communicators itself).
  std::unique_ptr<Comm> split(int color, int key);
  // Collective: an id that is the same on the ranks that share this rank's
  // node (machine) and differs between nodes: the lowest rank of the node.
  // MPI: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); the others: the host
  // names (gethostname), allgathered over this communicator.
  virtual int node_id();

  // Bytes this rank has sent so far, counted as a ring/pairwise
  // implementation sends them (docs/design/compressed-allreduce.md section 7):
  // allreduce 2(P-1)/P * n, reduce_scatter and alltoall (P-1)/P * total,
  // allgather (P-1) * send; a sub-communicator's (split) count in its
  // parent's too.
  uint64_t bytes_sent() const { return bytes_.sent; }
  // The same with, in inter_node, the bytes sent to ranks of other nodes
  // (pairwise: of the P - 1 equal parts a collective sends, those to the
  // ranks off this rank's node, an allreduce's 2 (P-R) n / P rounded down;
  // an alltoallv's blocks by their destination). 0 until set_nodes.
  CommBytes bytes() const { return bytes_; }
  // What an allgather of `send_bytes` per rank counts (posted ahead of the
  // allgather itself: a deferred gather).
  CommBytes allgather_bytes(uint64_t send_bytes) const;
  // The node of every rank (size() entries), for bytes().inter_node.
  void set_nodes(std::vector<int> node_of_rank);

  // The node and rail communicators the caller made for this one
  // (dsopt_comm_set_nodes), borrowed: node, the ranks of this rank's node
  // ranked by local index; rail, the ranks of its local index, one per
  // node, ranked by node. They count their bytes in this one's, as split
  // ones do, and say that every rail peer is on another node. Both nullptr:
  // none (the ones given before are let go). Checked collectively where an
  // optimizer is created (OptimizerParts::find_topology).
  void set_given_nodes(Comm* node, Comm* rail);
  // Marks `node` and `rail` as a node and a rail communicator for the
  // bytes they count across nodes: none of the node's peers, every one of
  // the rail's.
  static void mark_node_and_rail(Comm& node, Comm& rail);
  Comm* given_node() const { return given_node_; }
  Comm* given_rail() const { return given_rail_; }

  // The communicator of the ranks that hold the other shards of the
  // parameters of optimizers created on this one (dsopt_comm_set_shards),
  // borrowed; it counts its bytes in this one's. nullptr: none (the one
  // given before is let go).
  void set_given_shards(Comm* shards);
  Comm* given_shards() const { return given_shards_; }

 protected:
  virtual void do_allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                            const Mem& mem) = 0;
  virtual void do_reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                                 const Mem& mem) = 0;
  virtual void do_allgather(const void* send, void* recv, size_t count, Elem e,
                            const Mem& mem) = 0;
  virtual void do_alltoallv(const void* send, const size_t* send_counts,
                            const size_t* send_offsets, void* recv, const size_t* recv_counts,
                            const size_t* recv_offsets, Elem e, const Mem& mem) = 0;
  // Whether float sums on host buffers are dsopt's fixed-order ones (see
  // the top of this file); false leaves them to do_allreduce and
  // do_reduce_scatter.
  virtual bool orders_host_sums() const { return true; }
  // The fixed-order reduce-scatter of a float sum on host buffers: an
  // alltoall, then the sums. Backends may move the blocks otherwise (MPI: a
  // ring) but must add in the same order.
  // `scale` (fp32 only; 1: none) multiplies each sum in the pass of its
  // last addition.
  virtual void do_ordered_reduce_scatter(const void* send, void* recv, size_t count, Elem e,
                                         const Mem& mem, float scale);
  // The fixed-order allreduce of a float sum on host buffers: block b is
  // elements [b*q, min((b+1)*q, count)) with q = ceil(count / P). Default:
  // the reduce-scatter of the buffer padded with zeros to P*q, then an
  // allgather.
  virtual void do_ordered_allreduce(const void* send, void* recv, size_t count, Elem e,
                                    const Mem& mem);
  // split() once the color is checked; the default fails with
  // DSOPT_EUNSUPPORTED.
  virtual std::unique_ptr<Comm> do_split(int color, int key);
  // The nonblocking forms where overlaps(mem); nullptr: run the blocking one.
  virtual std::unique_ptr<CommRequest> do_start_alltoall(const void* send, void* recv, size_t count,
                                                         Elem e, const Mem& mem);
  virtual std::unique_ptr<CommRequest> do_start_allgather(const void* send, void* recv,
                                                          size_t count, Elem e, const Mem& mem);

 private:
  bool ordered(Elem e, ReduceOp op, const Mem& mem) const;
  static constexpr size_t kOrderedPiece = size_t(1) << 30;
  // What start_* returns: the backend's request (its bytes counted), or,
  // when there is none, a finished one after running `blocking`.
  std::unique_ptr<CommRequest> started(std::unique_ptr<CommRequest> request, size_t count, Elem e,
                                       const std::function<void()>& blocking);

  // Counts `b` here and in every parent (a sub-communicator's traffic is
  // its parent's).
  void add_bytes(const CommBytes& b);
  // A reduce-scatter's bytes, blocks of `block_bytes` (pairwise: one block to each other rank).
  void count_reduce_scatter(uint64_t block_bytes);

  CommBytes bytes_;
  Comm* parent_ = nullptr;     // the communicator this one was split from, or given to
  Comm* given_node_ = nullptr;  // set_given_nodes (borrowed)
  Comm* given_rail_ = nullptr;
  Comm* given_shards_ = nullptr;  // set_given_shards (borrowed)
  std::vector<int> node_of_;   // set_nodes; empty: not known
  int off_node_ = 0;           // ranks on other nodes than this rank's
  double timeout_s_ = 0.0;
  const void* pending_owner_ = nullptr;
  std::function<void()> pending_finish_;
};

std::unique_ptr<Comm> make_local_comm();
// Throws Error(DSOPT_EUNSUPPORTED) in a build without MPI, Error(DSOPT_EINVAL)
// when MPI is not initialised or the handle is not a communicator.
std::unique_ptr<Comm> make_mpi_comm(int64_t fortran_handle);
// The caller's collectives (dsopt_comm_create_custom); `ops` is validated
// and copied. Throws Error(DSOPT_EINVAL) for a bad table.
std::unique_ptr<Comm> make_custom_comm(const ::dsopt_comm_ops& ops, void* user);
// Throws Error(DSOPT_EUNSUPPORTED) in a build without NCCL or when
// libnccl.so.2 cannot be loaded.
std::unique_ptr<Comm> make_nccl_comm(void* nccl_comm, void* cuda_stream);

// "mpi=<library version>" or "mpi=off", for dsopt_build_info.
std::string mpi_build_info();

}  // namespace dsopt
