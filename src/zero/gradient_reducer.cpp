#include "zero/gradient_reducer.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace dsopt {

GradientReducer::GradientReducer(const ShardLayout& layout, int stage, bool reduce_scatter,
                                 const ZeroCompression& compression, Comm& comm, Kernels& kernels,
                                 const Mem& mem, const ParamSet& params, RankAgreement& agreement,
                                 CommRunner& runner, void* scratch)
    : GradientHandover(kernels), layout_(layout), stage_(stage), reduce_scatter_(reduce_scatter),
      comm_(comm), mem_(mem), params_(params), agreement_(agreement), runner_(runner),
      scratch_(scratch), buffer_bytes_(scratch_bytes(layout, compression)) {
  shard_ = DeviceBuffer(kernels_, size_t(layout_.shard_numel()) * 4);
  const int world = layout_.world();
  if (world == 1) return;  // nothing travels: no codec applies
  codec_ = block_codec(compression.gradients);
  if (!codec_) return;
  block_ = compression.gradient_block;
  send_ = DeviceBuffer(kernels_, std::max(size_t(codec_run_bytes(*codec_, block_, largest_piece(layout_))),
                                          aside_bytes(layout_, *codec_, block_)));
  if (compression.error_feedback) make_residual();
}

void GradientReducer::make_residual() {
  size_t at = 0;
  residual_at_.clear();
  for (const ReduceBucket& b : layout_.buckets()) {
    residual_at_.push_back(at);
    at += bucket_residual_bytes(layout_, b, block_, pieces());
  }
  residual_ = DeviceBuffer(kernels_, at);
  pending_ = DeviceBuffer(kernels_, at);
  kernels_.fill_zero(residual_.get(), at);  // zero scales: every residual is 0
  kernels_.fill_zero(pending_.get(), at);
}

void GradientReducer::set_hierarchy(const Topology& t, Comm& node, Comm& rail) {
  if (!codec_ || t.ranks_per_node < 2) return;
  if (t.world() != layout_.world() || node.size() != t.ranks_per_node || rail.size() != t.nodes)
    fail(DSOPT_EINTERNAL, "GradientReducer::set_hierarchy: topology " + t.describe() + " for " +
                              std::to_string(layout_.world()) + " ranks");
  node_ = &node;
  rail_ = &rail;
  nodes_ = t.nodes;
  per_node_ = t.ranks_per_node;
  local_ = t.local;
  rank_of_.assign(size_t(t.world()), -1);
  std::vector<int> seen(size_t(nodes_), 0);
  for (int r = 0; r < t.world(); ++r) {
    const int k = t.node_of_rank[size_t(r)];
    rank_of_[size_t(k * per_node_ + seen[size_t(k)]++)] = r;
  }
  consecutive_ = true;
  for (int k = 0; k < nodes_; ++k)
    for (int j = 1; j < per_node_; ++j)
      if (rank_of_[size_t(k * per_node_ + j)] != rank_of_[size_t(k * per_node_)] + j) consecutive_ = false;
  const int64_t m = largest_piece(layout_);
  send_ = DeviceBuffer();  // nothing is encoded aside
  slice_ = DeviceBuffer(kernels_, size_t(nodes_) * size_t(m) * 4);
  codes_ = DeviceBuffer(kernels_, 2 * size_t(nodes_) * size_t(codec_run_bytes(*codec_, block_, m)));
  node_blocks_ = DeviceBuffer(kernels_, size_t(per_node_) * size_t(m) * 4);
  if (!consecutive_) gathered_ = DeviceBuffer(kernels_, size_t(per_node_) * size_t(m) * 4);
  if (feedback()) make_residual();
}

size_t GradientReducer::residual_bytes() const {
  return feedback() ? residual_.bytes() : 0;
}

bool GradientReducer::in_place(BlockCodec codec, int64_t block, int64_t piece) {
  return codec_run_bytes(codec, block, piece) <= 2 * piece;
}

size_t GradientReducer::aside_bytes(const ShardLayout& layout, BlockCodec codec, int64_t block) {
  size_t bytes = 0;
  for (const ReduceBucket& b : layout.buckets()) {
    const int64_t piece = b.numel / layout.world();
    if (!in_place(codec, block, piece))
      bytes = std::max(bytes, size_t(layout.world() * codec_run_bytes(codec, block, piece)));
  }
  return bytes;
}

int64_t GradientReducer::largest_piece(const ShardLayout& layout) {
  int64_t largest = 0;
  for (const ReduceBucket& b : layout.buckets()) largest = std::max(largest, b.numel / layout.world());
  return largest;
}

size_t GradientReducer::bucket_residual_bytes(const ShardLayout& layout, const ReduceBucket& b,
                                              int64_t block, int pieces) {
  return size_t(pieces * codec_run_bytes(BlockCodec::Int8, block, b.numel / layout.world()));
}

size_t GradientReducer::residual_bytes(const ShardLayout& layout, int64_t block, int pieces) {
  size_t bytes = 0;
  for (const ReduceBucket& b : layout.buckets()) bytes += bucket_residual_bytes(layout, b, block, pieces);
  return bytes;
}

uint64_t GradientReducer::exchange_compressed(int64_t k, float* packed, uint8_t* spare,
                                              float* dest) {
  const ReduceBucket& b = layout_.buckets()[size_t(k)];
  const int world = layout_.world();
  const int64_t piece = b.numel / world;
  const int64_t run = codec_run_bytes(*codec_, block_, piece);
  // The residual this encoding starts from: the current one for the
  // window's first encoding of the bucket, the pending one after that.
  const uint8_t* e_in = nullptr;
  uint8_t* e_out = nullptr;
  float e_mul = 1.0f;
  if (feedback()) {
    e_out = static_cast<uint8_t*>(pending_.get()) + residual_at_[size_t(k)];
    e_in = encoded_[size_t(k)] ? e_out : static_cast<uint8_t*>(residual_.get()) + residual_at_[size_t(k)];
    if (!encoded_[size_t(k)]) e_mul = rescale();  // the pending copy is in the step's scale
  }
  encoded_[size_t(k)] = 1;
  if (hierarchical())
    return runner_.post([this, b, packed, e_in, e_mul, e_out, dest] {
      exchange_hierarchical(b, packed, e_in, e_mul, e_out, dest);
    });
  uint8_t* aside = static_cast<uint8_t*>(send_.get());
  const BlockCodec codec = *codec_;
  const int64_t block = block_;
  const bool fits = in_place(codec, block, piece);
  return runner_.post([this, codec, block, packed, e_in, e_mul, e_out, piece, run, aside, spare, dest,
                       world, fits] {
    uint8_t* send = aside;
    uint8_t* recv = spare;
    if (fits) {
      // Piece j > 0 ends at (j + 1) run <= 2 piece (j + 1) <= 4 piece j, where
      // its own gradients start: it overwrites only those of pieces before it.
      send = reinterpret_cast<uint8_t*>(packed);
      recv = send + size_t(world) * size_t(run);
      const int64_t e_run = codec_run_bytes(BlockCodec::Int8, block, piece);
      for (int j = 0; j < world; ++j)
        kernels_.codec_encode(codec, block, packed + j * piece, e_in ? e_in + j * e_run : nullptr, e_mul,
                              e_out ? e_out + j * e_run : nullptr, piece, 1, j ? send + j * run : aside);
      kernels_.copy(send, aside, size_t(run));
    } else {
      kernels_.codec_encode(codec, block, packed, e_in, e_mul, e_out, piece, world, send);
    }
    comm_.alltoall(send, recv, size_t(run), Elem::U8, mem_);
    comm_.wait();
    kernels_.codec_decode_sum(codec, block, recv, world, piece, dest);
  });
}

void GradientReducer::exchange_hierarchical(const ReduceBucket& b, float* packed, const uint8_t* e_in,
                                            float e_mul, uint8_t* e_out, float* dest) {
  const int64_t m = b.numel / layout_.world();
  const int64_t run = codec_run_bytes(*codec_, block_, m);
  float* slice = slice_.floats();
  float* blocks = node_blocks_.floats();
  // 1. Inside the node, fp32: for each node k', the pieces of its ranks go
  //    to the local ranks of the same index (an all-to-all over the node),
  //    and local rank j sums the R it receives of rank (k', j)'s piece in
  //    the communicator's fixed order, ((x[j+1] + x[j+2]) + ...) + x[j]
  //    (comm.hpp), with the kernels: the same bits on host and device
  //    buffers, whatever MPI or NCCL is behind.
  for (int k = 0; k < nodes_; ++k) {
    const int* ranks = rank_of_.data() + size_t(k) * size_t(per_node_);
    const float* src = packed + int64_t(ranks[0]) * m;
    if (!consecutive_) {
      float* g = gathered_.floats();
      for (int j = 0; j < per_node_; ++j)
        kernels_.copy(g + int64_t(j) * m, packed + int64_t(ranks[j]) * m, size_t(m) * 4);
      src = g;
    }
    node_->alltoall(src, blocks, size_t(m), Elem::F32, mem_);
    node_->wait();
    float* sum = slice + int64_t(k) * m;
    kernels_.copy(sum, blocks + int64_t((local_ + 1) % per_node_) * m, size_t(m) * 4);
    for (int t = 2; t <= per_node_; ++t) {
      const TensorRef x{blocks + int64_t((local_ + t) % per_node_) * m, m, DType::F32};
      kernels_.accumulate(&x, 1, sum);
    }
  }
  // 2. Across nodes, compressed: the N pieces of the node-slice (with this
  //    rank's residual there) to their owners, one per node.
  uint8_t* send = static_cast<uint8_t*>(codes_.get());
  uint8_t* recv = send + size_t(nodes_) * size_t(run);
  kernels_.codec_encode(*codec_, block_, slice, e_in, e_mul, e_out, m, nodes_, send);
  rail_->alltoall(send, recv, size_t(run), Elem::U8, mem_);
  rail_->wait();
  // 3. The owner sums the decoded pieces in node order.
  kernels_.codec_decode_sum(*codec_, block_, recv, nodes_, m, dest);
}

float GradientReducer::rescale() const { return float(step_scale_ / residual_scale_); }

void GradientReducer::reset_feedback() {
  if (!feedback()) return;
  kernels_.fill_zero(residual_.get(), residual_.bytes());
}

void GradientReducer::load_fp32_residual(const float* host) {
  if (!feedback()) return;
  if (hierarchical()) fail(DSOPT_EINTERNAL, "an fp32 (flat) residual loaded into a node-aware one");
  DeviceBuffer values(kernels_, size_t(layout_.padded_numel()) * 4);
  kernels_.copy_from_host(values.get(), host, values.bytes());
  const int world = layout_.world();
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    const ReduceBucket& b = layout_.buckets()[k];
    kernels_.codec_encode(BlockCodec::Int8, block_, values.floats() + b.flat_start, nullptr, 1.0f,
                          nullptr, b.numel / world, world,
                          static_cast<uint8_t*>(residual_.get()) + residual_at_[k]);
  }
  kernels_.synchronize();  // before `values` goes
}

void GradientReducer::commit_feedback() {
  if (!feedback()) return;
  // A window that completes reduces every bucket (GradientHandover::complete).
  for (char e : encoded_)
    if (!e) fail(DSOPT_EINTERNAL, "a step's update runs with a bucket whose gradients were not reduced");
  std::swap(residual_, pending_);
  residual_scale_ = step_scale_;
  std::fill(encoded_.begin(), encoded_.end(), 0);
}

size_t GradientReducer::scratch_bytes(const ShardLayout& layout, const ZeroCompression& compression) {
  if (layout.world() == 1) return 0;  // one rank packs straight into the shard
  int64_t largest = 0;
  for (const ReduceBucket& b : layout.buckets()) largest = std::max(largest, b.numel);
  size_t bytes = size_t(largest) * 4;
  // Pieces encoded aside are received into a bucket's buffer.
  if (const std::optional<BlockCodec> codec = block_codec(compression.gradients))
    bytes = std::max(bytes, aside_bytes(layout, *codec, compression.gradient_block));
  return bytes;
}

GradientHandover::Plan GradientReducer::flat_plan() const {
  Plan p;
  int64_t at = 0;
  for (int64_t n : layout_.numels()) {
    p.pos.push_back(at);
    p.numel.push_back(n);
    p.bucketed.push_back(1);
    at += n;
  }
  for (const ReduceBucket& b : layout_.buckets()) p.bucket_ends.push_back(b.flat_start + b.numel);
  return p;
}

bool GradientReducer::accumulates_locally() const {
  return stage_ == 1 && micro_batches() > 1 && layout_.world() > 1;
}

bool GradientReducer::fresh(int m) const {
  // One rank keeps the sum in the shard itself; stage 1 in its flat buffer.
  if (layout_.world() == 1 || accumulates_locally()) return m == 0;
  return true;  // every micro-batch packs into a fresh bucket buffer
}

bool GradientReducer::reduces(int m) const {
  return accumulates_locally() ? m + 1 == micro_batches() : true;
}

float* GradientReducer::storage(int64_t k, int64_t pos) {
  if (layout_.world() == 1) return shard() + pos;  // the shard is the flat range
  if (accumulates_locally()) {
    if (!local_sum_.get()) local_sum_ = DeviceBuffer(kernels_, size_t(layout_.padded_numel()) * 4);
    return local_sum_.floats() + pos;
  }
  const ReduceBucket& b = layout_.buckets()[size_t(k)];
  if (bucket_buffer_[size_t(k)] < 0) {
    reclaim(false);
    // At most kBuffers while reductions run: wait for the oldest one (it was
    // posted, so it finishes once every rank has posted it). Buffers held
    // by buckets still filling cannot be waited for: then one more is made.
    if (free_.empty() && pool_.size() >= kBuffers && !in_flight_.empty()) {
      runner_.wait_for(in_flight_.front().ticket);
      reclaim(false);
    }
    if (free_.empty()) {
      Buffer fresh_buffer;
      if (pool_.empty()) {
        fresh_buffer.send = static_cast<float*>(scratch_);
      } else {
        fresh_buffer.own = DeviceBuffer(kernels_, buffer_bytes_);
        fresh_buffer.send = fresh_buffer.own.floats();
      }
      pool_.push_back(std::move(fresh_buffer));
      free_.push_back(pool_.size() - 1);
    }
    bucket_buffer_[size_t(k)] = int64_t(free_.back());
    free_.pop_back();
  }
  return pool_[size_t(bucket_buffer_[size_t(k)])].send + (pos - b.flat_start);
}

void GradientReducer::reduce(int64_t k, int m) {
  const ReduceBucket& b = layout_.buckets()[size_t(k)];
  float* packed = storage(k, b.flat_start);
  // Padding past the last parameter is zero.
  const int64_t used = std::min(b.numel, std::max<int64_t>(0, layout_.flat_numel() - b.flat_start));
  if (used < b.numel) kernels_.fill_zero(packed + used, size_t(b.numel - used) * 4);
  if (layout_.world() == 1) return;
  const int64_t piece = b.numel / layout_.world();
  // The first reduction of a window lands in the shard; later micro-batches'
  // (stage 2) land aside and are added in reclaim().
  const bool add = m > 0 && !accumulates_locally();
  float* dest = shard() + b.shard_offset;
  size_t buffer = 0;
  if (!accumulates_locally()) {
    buffer = size_t(bucket_buffer_[size_t(k)]);
    bucket_buffer_[size_t(k)] = -1;
    if (add) {
      Buffer& buf = pool_[buffer];
      if (!buf.received.get()) buf.received = DeviceBuffer(kernels_, size_t(largest_piece(layout_)) * 4);
      dest = buf.received.floats();
    }
  }
  const int rank = comm_.rank();
  if (compressed()) {
    // Stage 1's flat buffer is refilled in the next window; it leaves the
    // scratch free for what is received aside.
    uint8_t* spare = static_cast<uint8_t*>(accumulates_locally() ? scratch_ : pool_[buffer].send);
    const uint64_t ticket = exchange_compressed(k, packed, spare, dest);
    if (!accumulates_locally()) in_flight_.push_back(InFlight{ticket, buffer, k, add});
    return;
  }
  const uint64_t ticket = runner_.post([this, packed, dest, piece, rank, b] {
    if (reduce_scatter_) {
      comm_.reduce_scatter(packed, dest, size_t(piece), Elem::F32, ReduceOp::Sum, mem_);
    } else {
      comm_.allreduce(packed, packed, size_t(b.numel), Elem::F32, ReduceOp::Sum, mem_);
      kernels_.copy(dest, packed + rank * piece, size_t(piece) * 4);
    }
    comm_.wait();
  });
  if (!accumulates_locally()) in_flight_.push_back(InFlight{ticket, buffer, k, add});
}

void GradientReducer::reclaim(bool all) {
  size_t done = 0;
  for (; done < in_flight_.size(); ++done) {
    const InFlight& f = in_flight_[done];
    if (!all && !runner_.done(f.ticket)) break;  // they finish in order
    if (f.add) {
      const ReduceBucket& b = layout_.buckets()[size_t(f.bucket)];
      const TensorRef piece{pool_[f.buffer].received.floats(), b.numel / layout_.world(), DType::F32};
      kernels_.accumulate(&piece, 1, shard() + b.shard_offset);
    }
    free_.push_back(f.buffer);
  }
  in_flight_.erase(in_flight_.begin(), in_flight_.begin() + std::ptrdiff_t(done));
}

void GradientReducer::open_handover(int micro_batches) {
  bucket_buffer_.assign(layout_.buckets().size(), -1);
  encoded_.assign(layout_.buckets().size(), 0);
  in_flight_.clear();
  free_.clear();
  for (size_t i = 0; i < pool_.size(); ++i) free_.push_back(i);
  open(flat_plan(), micro_batches);
}

ReducedShard GradientReducer::reduce_at_once(const dsopt_tensor* grads, int64_t count, bool norm) {
  const int world = layout_.world();
  const std::string local_error = params_.check_grads(grads, count);
  if (world == 1 && !local_error.empty()) fail(DSOPT_EINVAL, "dsopt_step: " + local_error);
  const bool ok = local_error.empty();
  open_handover(1);
  if (ok) {
    std::vector<TensorRef> refs;
    for (int64_t i = 0; i < count; ++i)
      refs.push_back(TensorRef{grads[i].data, grads[i].numel, DType(grads[i].dtype)});
    hand_over_bucketed(refs.data());
  }
  complete();
  runner_.wait();
  reclaim(true);
  const bool nonfinite = this->nonfinite();
  close();
  return finish(1.0f / float(world), nonfinite, norm, local_error);
}

ReducedShard GradientReducer::reduce_handed_over(bool norm) {
  reclaim(true);
  const bool nonfinite = this->nonfinite();
  const float mul = 1.0f / (float(layout_.world()) * float(micro_batches()));
  close();
  return finish(mul, nonfinite, norm, "");
}

ReducedShard GradientReducer::finish(float mul, bool nonfinite, bool norm,
                                     const std::string& local_error) {
  // a = fl(sum * mul) in place; the sums are checked and summed too.
  ReducedShard out;
  const TensorRef whole{shard(), layout_.shard_numel(), DType::F32};
  if (mul != 1.0f || norm)
    nonfinite |= kernels_.transform(&whole, 1, mul, mul != 1.0f ? shard() : nullptr,
                                    norm ? &out.sumsq : nullptr).nonfinite;
  out.nonfinite = nonfinite;
  if (layout_.world() > 1) {
    out.nonfinite = agreement_.settle_sum(kStepFailure, LocalOutcome::invalid_if(local_error),
                                          nonfinite, &out.sumsq);
  }
  return out;
}

}  // namespace dsopt
