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
      scratch_(scratch) {
  shard_ = DeviceBuffer(kernels_, size_t(layout_.shard_numel()) * 4);
  const int world = layout_.world();
  if (world == 1) return;  // nothing travels: no codec applies
  codec_ = block_codec(compression.gradients);
  if (!codec_) return;
  block_ = compression.gradient_block;
  int64_t largest = 0;
  for (const ReduceBucket& b : layout_.buckets()) largest = std::max(largest, b.numel / world);
  wire_ = DeviceBuffer(kernels_, size_t(2 * world * codec_run_bytes(*codec_, block_, largest)));
  if (compression.error_feedback) {
    const size_t bytes = size_t(layout_.padded_numel()) * 4;
    residual_ = DeviceBuffer(kernels_, bytes);
    pending_ = DeviceBuffer(kernels_, bytes);
    kernels_.fill_zero(residual_.get(), bytes);
    kernels_.fill_zero(pending_.get(), bytes);
  }
}

uint64_t GradientReducer::exchange_compressed(int64_t k, const float* packed, float* dest) {
  const ReduceBucket& b = layout_.buckets()[size_t(k)];
  const int world = layout_.world();
  const int64_t piece = b.numel / world;
  const int64_t run = codec_run_bytes(*codec_, block_, piece);
  // The residual this encoding starts from: the current one for the
  // window's first encoding of the bucket, the pending one after that.
  float* e_in = nullptr;
  float* e_out = nullptr;
  float e_mul = 1.0f;
  if (feedback()) {
    e_out = pending_.floats() + b.flat_start;
    e_in = encoded_[size_t(k)] ? e_out : residual_.floats() + b.flat_start;
    if (!encoded_[size_t(k)]) e_mul = rescale();  // the pending copy is in the step's scale
  }
  encoded_[size_t(k)] = 1;
  uint8_t* send = static_cast<uint8_t*>(wire_.get());
  uint8_t* recv = send + size_t(world) * size_t(run);
  const BlockCodec codec = *codec_;
  const int64_t block = block_;
  return runner_.post([this, codec, block, packed, e_in, e_mul, e_out, piece, run, send, recv, dest,
                       world] {
    kernels_.codec_encode(codec, block, packed, e_in, e_mul, e_out, piece, world, send);
    comm_.alltoall(send, recv, size_t(run), Elem::U8, mem_);
    comm_.wait();
    kernels_.codec_decode_sum(codec, block, recv, world, piece, dest);
  });
}

float GradientReducer::rescale() const { return float(step_scale_ / residual_scale_); }

void GradientReducer::reset_feedback() {
  if (!feedback()) return;
  kernels_.fill_zero(residual_.get(), residual_.bytes());
}

void GradientReducer::commit_feedback() {
  if (!feedback()) return;
  const float mul = rescale();
  for (size_t k = 0; k < encoded_.size(); ++k) {
    if (encoded_[k]) continue;  // a bucket the window did not reduce keeps its residual
    const ReduceBucket& b = layout_.buckets()[k];
    const TensorRef kept{residual_.floats() + b.flat_start, b.numel, DType::F32};
    kernels_.transform(&kept, 1, mul, pending_.floats() + b.flat_start, nullptr);
  }
  std::swap(residual_, pending_);
  residual_scale_ = step_scale_;
  std::fill(encoded_.begin(), encoded_.end(), 0);
}

size_t GradientReducer::scratch_bytes(const ShardLayout& layout) {
  if (layout.world() == 1) return 0;  // one rank packs straight into the shard
  int64_t largest = 0;
  for (const ReduceBucket& b : layout.buckets()) largest = std::max(largest, b.numel);
  return size_t(largest) * 4;
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
        fresh_buffer.own = DeviceBuffer(kernels_, scratch_bytes(layout_));
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
      if (!buf.received.get()) buf.received = DeviceBuffer(kernels_, scratch_bytes(layout_) / size_t(layout_.world()));
      dest = buf.received.floats();
    }
  }
  const int rank = comm_.rank();
  if (compressed()) {
    const uint64_t ticket = exchange_compressed(k, packed, dest);
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
