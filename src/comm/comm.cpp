// The parts of Comm every backend shares: argument shapes and byte counting.
#include "comm/comm.hpp"

#include <vector>

#include "base/error.hpp"

namespace dsopt {
namespace {

// What a blocking collective started as a request returns.
class Done final : public CommRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace

size_t elem_size(Elem e) {
  switch (e) {
    case Elem::F32: return 4;
    case Elem::F64: return 8;
    case Elem::I32: return 4;
    case Elem::I64: return 8;
    case Elem::U8: return 1;
  }
  return 1;
}

void Comm::allreduce(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                     const Mem& mem) {
  const uint64_t p = uint64_t(size());
  if (count == 0) return;
  do_allreduce(send, recv, count, e, op, mem);
  bytes_sent_ += 2 * (p - 1) * count * elem_size(e) / p;
}

void Comm::reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                          const Mem& mem) {
  const uint64_t p = uint64_t(size());
  if (count == 0) return;
  do_reduce_scatter(send, recv, count, e, op, mem);
  bytes_sent_ += (p - 1) * count * elem_size(e);
}

void Comm::allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) {
  const uint64_t p = uint64_t(size());
  if (count == 0) return;
  do_allgather(send, recv, count, e, mem);
  bytes_sent_ += (p - 1) * count * elem_size(e);
}

void Comm::alltoall(const void* send, void* recv, size_t count, Elem e, const Mem& mem) {
  const size_t p = size_t(size());
  std::vector<size_t> counts(p, count), offsets(p);
  for (size_t i = 0; i < p; ++i) offsets[i] = i * count;
  alltoallv(send, counts.data(), offsets.data(), recv, counts.data(), offsets.data(), e, mem);
}

void Comm::alltoallv(const void* send, const size_t* send_counts, const size_t* send_offsets,
                     void* recv, const size_t* recv_counts, const size_t* recv_offsets, Elem e,
                     const Mem& mem) {
  do_alltoallv(send, send_counts, send_offsets, recv, recv_counts, recv_offsets, e, mem);
  for (int j = 0; j < size(); ++j)
    if (j != rank()) bytes_sent_ += send_counts[j] * elem_size(e);
}

void Comm::broadcast(void* buf, size_t count, Elem e, int root, const Mem& mem) {
  if (root < 0 || root >= size()) throw Error(DSOPT_EINTERNAL, "broadcast root out of range");
  if (count == 0 || size() == 1) return;
  do_broadcast(buf, count, e, root, mem);
  if (rank() == root) bytes_sent_ += count * elem_size(e);
}

std::unique_ptr<CommRequest> Comm::start_alltoall(const void* send, void* recv, size_t count,
                                                  Elem e, const Mem& mem) {
  return started(count > 0 ? do_start_alltoall(send, recv, count, e, mem) : nullptr, count, e,
                 [&] { alltoall(send, recv, count, e, mem); });
}

std::unique_ptr<CommRequest> Comm::start_allgather(const void* send, void* recv, size_t count,
                                                   Elem e, const Mem& mem) {
  return started(count > 0 ? do_start_allgather(send, recv, count, e, mem) : nullptr, count, e,
                 [&] { allgather(send, recv, count, e, mem); });
}

std::unique_ptr<CommRequest> Comm::started(std::unique_ptr<CommRequest> request, size_t count,
                                           Elem e, const std::function<void()>& blocking) {
  if (!request) {
    blocking();
    return std::make_unique<Done>();
  }
  // alltoall and allgather alike: count elements to each of the P - 1 others
  bytes_sent_ += uint64_t(size() - 1) * count * elem_size(e);
  return request;
}

std::unique_ptr<CommRequest> Comm::do_start_alltoall(const void*, void*, size_t, Elem, const Mem&) {
  return nullptr;
}

std::unique_ptr<CommRequest> Comm::do_start_allgather(const void*, void*, size_t, Elem, const Mem&) {
  return nullptr;
}

}  // namespace dsopt
