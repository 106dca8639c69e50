#include "zero/shard_layout.hpp"

#include <algorithm>

namespace dsopt {

ShardLayout::ShardLayout(std::vector<int64_t> numels, int world, int64_t bucket_elems)
    : numels_(std::move(numels)), world_(world) {
  for (int64_t n : numels_) {
    starts_.push_back(flat_);
    flat_ += n;
  }
  const int64_t align = 2 * int64_t(world_);
  padded_ = (flat_ + align - 1) / align * align;
  bucket_ = std::max(align, bucket_elems / align * align);
  for (int64_t start = 0; start < padded_; start += bucket_)
    buckets_.push_back(ReduceBucket{start, std::min(bucket_, padded_ - start), start / world_});
}

std::vector<FlatRun> ShardLayout::runs(int64_t begin, int64_t end) const {
  std::vector<FlatRun> out;
  end = std::min(end, flat_);
  if (begin >= end) return out;
  // The last parameter that starts at or before `begin`.
  size_t i = size_t(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
  for (int64_t at = begin; at < end; ++i) {
    const int64_t stop = std::min(end, starts_[i] + numels_[i]);
    if (stop > at) out.push_back(FlatRun{int64_t(i), at - starts_[i], stop - at});
    at = std::max(at, stop);
  }
  return out;
}

std::vector<ShardFragment> ShardLayout::fragments(int rank) const {
  return fragments(rank, 0, shard_numel());
}

std::vector<ShardFragment> ShardLayout::fragments(int rank, int64_t begin, int64_t end) const {
  std::vector<ShardFragment> out;
  for (const ReduceBucket& b : buckets_) {
    const int64_t piece = b.numel / world_;
    const int64_t lo = std::max(begin, b.shard_offset), hi = std::min(end, b.shard_offset + piece);
    if (lo >= hi) continue;
    const int64_t flat = b.flat_start + int64_t(rank) * piece + (lo - b.shard_offset);
    for (const FlatRun& run : runs(flat, flat + (hi - lo)))
      out.push_back(ShardFragment{run.param, run.param_offset,
                                  lo + (starts_[size_t(run.param)] + run.param_offset - flat),
                                  run.numel});
  }
  return out;
}

}  // namespace dsopt
