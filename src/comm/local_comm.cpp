// A world of one rank: every collective is a copy.
#include <cstring>

#include "comm/comm.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace {

class LocalComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  int node_id() override { return 0; }

 protected:
  void do_allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp,
                    const Mem& mem) override {
    copy(send, recv, count * elem_size(e), mem);
  }
  void do_reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp,
                         const Mem& mem) override {
    copy(send, recv, count * elem_size(e), mem);
  }
  void do_allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) override {
    copy(send, recv, count * elem_size(e), mem);
  }
  void do_alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                    void* recv, const size_t*, const size_t* recv_offsets, Elem e,
                    const Mem& mem) override {
    const size_t es = elem_size(e);
    copy(static_cast<const char*>(send) + send_offsets[0] * es,
         static_cast<char*>(recv) + recv_offsets[0] * es, send_counts[0] * es, mem);
  }

  std::unique_ptr<Comm> do_split(int, int) override { return std::make_unique<LocalComm>(); }

 private:
  static void copy(const void* src, void* dst, size_t bytes, const Mem& mem) {
    if (src == dst || !bytes) return;
    if (mem.kernels) mem.kernels->copy(dst, src, bytes);
    else std::memcpy(dst, src, bytes);
  }
};

}  // namespace

std::unique_ptr<Comm> make_local_comm() { return std::make_unique<LocalComm>(); }

}  // namespace dsopt
