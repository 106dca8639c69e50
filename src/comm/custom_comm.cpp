// Comm over the caller's own collectives (dsopt_comm_create_custom): each
// call goes to a callback of the dsopt_comm_ops table; a nonzero return
// becomes DSOPT_ECOMM with the callback's text, and the communicator is not
// used again after it.
//
// It cannot be split (Comm::split fails with DSOPT_EUNSUPPORTED): the
// callbacks run the caller's collectives over one group, and dsopt has no
// way to make the caller's runtime form new groups. Node-aware collectives
// over callbacks take the node and rail communicators from the caller (two
// more custom communicators), which knows its own runtime's groups.
// node_id() works (host names through the allgather callback).
#include <string>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "dsopt.h"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace {

int32_t comm_elem(Elem e) {
  switch (e) {
    case Elem::F32: return DSOPT_COMM_FLOAT32;
    case Elem::F64: return DSOPT_COMM_FLOAT64;
    case Elem::I32: return DSOPT_COMM_INT32;
    case Elem::I64: return DSOPT_COMM_INT64;
    case Elem::U8: return DSOPT_COMM_UINT8;
  }
  return DSOPT_COMM_UINT8;
}

int32_t comm_op(ReduceOp op) { return op == ReduceOp::Max ? DSOPT_COMM_MAX : DSOPT_COMM_SUM; }

int32_t comm_device(const Mem& mem) {
  return mem.on_device() ? DSOPT_COMM_CUDA : DSOPT_COMM_HOST;
}

class CustomComm final : public Comm {
 public:
  CustomComm(const dsopt_comm_ops& ops, void* user) : ops_(ops), user_(user) {}
  ~CustomComm() override {
    if (ops_.release != nullptr) ops_.release(user_);
  }
  CustomComm(const CustomComm&) = delete;
  CustomComm& operator=(const CustomComm&) = delete;

  int rank() const override { return ops_.rank; }
  int size() const override { return ops_.size; }
  const char* backend() const override { return "custom"; }
  void* cuda_stream() const override { return ops_.stream; }
  bool concurrent_calls() const override { return (ops_.flags & DSOPT_COMM_CONCURRENT) != 0; }

 protected:
  void do_allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                    const Mem& mem) override {
    usable();
    ok(ops_.allreduce(send, recv, count, comm_elem(e), comm_op(op), comm_device(mem), user_),
       "allreduce");
  }
  void do_reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                         const Mem& mem) override {
    usable();
    ok(ops_.reduce_scatter(send, recv, count, comm_elem(e), comm_op(op), comm_device(mem), user_),
       "reduce_scatter");
  }
  void do_allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) override {
    usable();
    ok(ops_.allgather(send, recv, count, comm_elem(e), comm_device(mem), user_), "allgather");
  }
  // dsopt's all-to-alls have equal, back-to-back blocks (Comm::alltoall).
  void do_alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                    void* recv, const size_t* recv_counts, const size_t* recv_offsets, Elem e,
                    const Mem& mem) override {
    const size_t count = send_counts[0];
    for (int j = 0; j < ops_.size; ++j)
      if (send_counts[j] != count || recv_counts[j] != count ||
          send_offsets[j] != size_t(j) * count || recv_offsets[j] != size_t(j) * count)
        fail(DSOPT_EINTERNAL, "custom communicator: all-to-all blocks of unequal size");
    if (count == 0) return;
    usable();
    ok(ops_.alltoall(send, recv, count, comm_elem(e), comm_device(mem), user_), "alltoall");
  }

 private:
  void ok(int rc, const char* call) {
    if (rc == 0) return;
    failed_ = true;
    const char* text = ops_.error_message != nullptr ? ops_.error_message(rc, user_) : nullptr;
    fail(DSOPT_ECOMM, std::string("custom communicator: ") + call + " returned " +
                          std::to_string(rc) + (text != nullptr && *text ? ": " + std::string(text) : ""));
  }
  void usable() const {
    if (failed_)
      fail(DSOPT_ECOMM, "an earlier collective of this custom communicator failed (see its error); "
                        "dsopt does not use it again: create a new communicator");
  }

  const dsopt_comm_ops ops_;
  void* const user_;
  bool failed_ = false;
};

void require(bool ok, const std::string& what) {
  if (!ok) fail(DSOPT_EINVAL, "dsopt_comm_ops: " + what);
}

}  // namespace

// `ops` is whole: dsopt_comm_create_custom read the caller's struct_size.
std::unique_ptr<Comm> make_custom_comm(const dsopt_comm_ops& ops, void* user) {
  require((ops.flags & ~uint32_t(DSOPT_COMM_CONCURRENT)) == 0,
          "unknown flags " + std::to_string(ops.flags));
  require(ops.size >= 1, "size " + std::to_string(ops.size) + " is not >= 1");
  require(ops.rank >= 0 && ops.rank < ops.size,
          "rank " + std::to_string(ops.rank) + " is not in [0, " + std::to_string(ops.size) + ")");
  require(ops.allreduce != nullptr, "allreduce is NULL");
  require(ops.reduce_scatter != nullptr, "reduce_scatter is NULL");
  require(ops.allgather != nullptr, "allgather is NULL");
  require(ops.alltoall != nullptr, "alltoall is NULL");
  return std::make_unique<CustomComm>(ops, user);
}

}  // namespace dsopt
