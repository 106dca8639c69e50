// The parts of Comm every backend shares: argument shapes and byte counting.
#include "comm/comm.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/scratch.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {
namespace {

// What a blocking collective started as a request returns.
class Done final : public CommRequest {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// The sums of the blocks of all ranks for this rank's block r: blocks[i] is
// rank i's, count elements each; out = ((b[r+1] + b[r+2]) + ...) + b[r].
template <class T>
void sum_in_ring_order(const T* blocks, T* out, size_t count, int P, int r, T scale) {
  const T* first = blocks + size_t((r + 1) % P) * count;
  std::copy(first, first + count, out);
  for (int k = 2; k <= P; ++k) {
    const T* b = blocks + size_t((r + k) % P) * count;
    if (k == P && scale != T(1))
      for (size_t i = 0; i < count; ++i) out[i] = (out[i] + b[i]) * scale;
    else
      for (size_t i = 0; i < count; ++i) out[i] = out[i] + b[i];
  }
}

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
  if (ordered(e, op, mem)) {
    // in pieces whose counts MPI takes as int (the same on every backend:
    // the pieces decide the blocks, so the order of the additions)
    const size_t es = elem_size(e);
    for (size_t off = 0; off < count; off += kOrderedPiece)
      do_ordered_allreduce(static_cast<const char*>(send) + off * es,
                           static_cast<char*>(recv) + off * es, std::min(kOrderedPiece, count - off),
                           e, mem);
  } else {
    do_allreduce(send, recv, count, e, op, mem);
  }
  // Pairwise: a reduce-scatter and an allgather of n / P to each other rank.
  const uint64_t n = count * elem_size(e), off = uint64_t(off_node_);
  add_bytes({2 * (p - 1) * n / p, 2 * off * n / p});
}

void Comm::reduce_scatter(const void* send, void* recv, size_t count, Elem e, ReduceOp op,
                          const Mem& mem) {
  if (count == 0) return;
  if (ordered(e, op, mem))
    do_ordered_reduce_scatter(send, recv, count, e, mem, 1.0f);
  else
    do_reduce_scatter(send, recv, count, e, op, mem);
  count_reduce_scatter(count * elem_size(e));
}

void Comm::count_reduce_scatter(uint64_t block_bytes) {
  add_bytes({uint64_t(size() - 1) * block_bytes, uint64_t(off_node_) * block_bytes});
}

void Comm::reduce_scatter_scaled(const float* send, float* recv, size_t count, float scale,
                                 const Mem& mem) {
  if (count == 0) return;
  if (!ordered(Elem::F32, ReduceOp::Sum, mem)) {
    reduce_scatter(send, recv, count, Elem::F32, ReduceOp::Sum, mem);
    if (scale == 1.0f) return;
    const TensorRef sums{recv, int64_t(count), DType::F32};
    if (!mem.kernels) fail(DSOPT_EINTERNAL, "Comm::reduce_scatter_scaled: no kernels for the scale");
    mem.kernels->transform(&sums, 1, scale, recv, nullptr);
    return;
  }
  do_ordered_reduce_scatter(send, recv, count, Elem::F32, mem, scale);
  count_reduce_scatter(count * 4);
}

void Comm::allgather(const void* send, void* recv, size_t count, Elem e, const Mem& mem) {
  if (count == 0) return;
  do_allgather(send, recv, count, e, mem);
  add_bytes(allgather_bytes(count * elem_size(e)));
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
  CommBytes b;
  for (int j = 0; j < size(); ++j) {
    if (j == rank()) continue;
    const uint64_t block = send_counts[j] * elem_size(e);
    b.sent += block;
    if (!node_of_.empty() && node_of_[size_t(j)] != node_of_[size_t(rank())]) b.inter_node += block;
  }
  add_bytes(b);
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
  add_bytes(allgather_bytes(count * elem_size(e)));
  return request;
}

CommBytes Comm::allgather_bytes(uint64_t send_bytes) const {
  const uint64_t total = uint64_t(size() - 1) * send_bytes;
  return {total, uint64_t(off_node_) * send_bytes};
}

void Comm::set_nodes(std::vector<int> node_of_rank) {
  if (node_of_rank.size() != size_t(size()))
    fail(DSOPT_EINTERNAL, "Comm::set_nodes: " + std::to_string(node_of_rank.size()) +
                              " nodes for a world of " + std::to_string(size()));
  node_of_ = std::move(node_of_rank);
  off_node_ = 0;
  for (int n : node_of_) off_node_ += n != node_of_[size_t(rank())];
}

void Comm::add_bytes(const CommBytes& b) {
  for (Comm* c = this; c; c = c->parent_) c->bytes_ += b;
}

Comm::~Comm() {
  set_given_nodes(nullptr, nullptr);
  set_given_shards(nullptr);
  if (parent_ && parent_->given_node_ == this) parent_->given_node_ = nullptr;
  if (parent_ && parent_->given_rail_ == this) parent_->given_rail_ = nullptr;
  if (parent_ && parent_->given_shards_ == this) parent_->given_shards_ = nullptr;
}

void Comm::set_given_shards(Comm* shards) {
  if (given_shards_ && given_shards_->parent_ == this) given_shards_->parent_ = nullptr;
  given_shards_ = shards;
  if (shards) shards->parent_ = this;
}

void Comm::set_given_nodes(Comm* node, Comm* rail) {
  for (Comm* c : {given_node_, given_rail_})
    if (c && c->parent_ == this) c->parent_ = nullptr;
  given_node_ = node;
  given_rail_ = rail;
  if (!node || !rail) return;
  node->parent_ = this;
  rail->parent_ = this;
  mark_node_and_rail(*node, *rail);
}

void Comm::mark_node_and_rail(Comm& node, Comm& rail) {
  node.set_nodes(std::vector<int>(size_t(node.size()), 0));
  std::vector<int> rail_nodes(size_t(rail.size()));
  for (int k = 0; k < rail.size(); ++k) rail_nodes[size_t(k)] = k;
  rail.set_nodes(std::move(rail_nodes));
}

std::unique_ptr<Comm> Comm::split(int color, int key) {
  if (color < 0) fail(DSOPT_EINTERNAL, "Comm::split: color " + std::to_string(color) + " < 0");
  std::unique_ptr<Comm> sub = do_split(color, key);
  sub->set_timeout(timeout());
  sub->parent_ = this;
  return sub;
}

std::unique_ptr<Comm> Comm::do_split(int, int) {
  fail(DSOPT_EUNSUPPORTED,
       std::string("a ") + backend() + " communicator cannot be split into node and rail "
       "communicators (dsopt cannot make new communicators out of the caller's callbacks): give "
       "dsopt the node and the rail communicators yourself, or use the flat compressed allreduce");
}

int Comm::node_id() {
  // Each rank's host name, fixed-size and NUL-padded; the node is the
  // lowest rank with the same name.
  constexpr size_t kName = 256;
  std::vector<char> mine(kName, 0), all(kName * size_t(size()), 0);
  if (gethostname(mine.data(), kName - 1) != 0)
    fail(DSOPT_ECOMM, "gethostname failed: the node of this rank is unknown");
  mine[kName - 1] = 0;
  allgather(mine.data(), all.data(), kName, Elem::U8, Mem::host());
  for (int i = 0; i < size(); ++i)
    if (std::memcmp(all.data() + size_t(i) * kName, mine.data(), kName) == 0) return i;
  return rank();
}

bool Mem::on_device() const { return kernels != nullptr && kernels->device() == Device::Cuda; }

bool Comm::ordered(Elem e, ReduceOp op, const Mem& mem) const {
  return size() > 1 && op == ReduceOp::Sum && (e == Elem::F32 || e == Elem::F64) &&
         !mem.on_device() && orders_host_sums();
}

void Comm::do_ordered_reduce_scatter(const void* send, void* recv, size_t count, Elem e,
                                     const Mem& mem, float scale) {
  const size_t p = size_t(size());
  std::vector<size_t> counts(p, count), offsets(p);
  for (size_t i = 0; i < p; ++i) offsets[i] = i * count;
  Scratch blocks(p * count * elem_size(e));
  do_alltoallv(send, counts.data(), offsets.data(), blocks.data(), counts.data(), offsets.data(), e,
               mem);
  if (e == Elem::F64)
    sum_in_ring_order(reinterpret_cast<const double*>(blocks.data()), static_cast<double*>(recv),
                      count, size(), rank(), 1.0);
  else
    sum_in_ring_order(reinterpret_cast<const float*>(blocks.data()), static_cast<float*>(recv),
                      count, size(), rank(), scale);
}

void Comm::do_ordered_allreduce(const void* send, void* recv, size_t count, Elem e,
                                const Mem& mem) {
  const size_t p = size_t(size()), es = elem_size(e), block = (count + p - 1) / p;
  const bool even = block * p == count;
  Scratch padded, gathered, mine(block * es);
  if (!even) {
    padded.resize(block * p * es);
    std::memcpy(padded.data(), send, count * es);
    std::memset(static_cast<void*>(padded.data() + count * es), 0, (block * p - count) * es);
    gathered.resize(block * p * es);
  }
  do_ordered_reduce_scatter(even ? send : padded.data(), mine.data(), block, e, mem, 1.0f);
  do_allgather(mine.data(), even ? recv : gathered.data(), block, e, mem);
  if (!even) std::memcpy(recv, gathered.data(), count * es);
}

std::unique_ptr<CommRequest> Comm::do_start_alltoall(const void*, void*, size_t, Elem, const Mem&) {
  return nullptr;
}

std::unique_ptr<CommRequest> Comm::do_start_allgather(const void*, void*, size_t, Elem, const Mem&) {
  return nullptr;
}

}  // namespace dsopt
