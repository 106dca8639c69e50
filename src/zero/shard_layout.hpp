// Where every parameter element lives under ZeRO stage 1/2 (docs/design/zero.md
// sections 3 and 5; docs/guides/zero.md "ZeRO"): one table from which reduction,
// update, allgather and checkpoints all take their offsets.
//
// The parameters are laid end to end in index order (the flat index), and
// padded with zeros to n' elements, a multiple of 2P. The flat range is
// cut into reduce buckets of B elements (B a multiple of 2P; the last
// bucket is shorter, still a multiple of 2P). Bucket k is split into P equal
// pieces; rank r owns piece r of every bucket, and its shard is those
// pieces back to back: S = n'/P elements. With one bucket (the default,
// reduce_bucket_size >= n') rank r owns the r-th contiguous slice, as in
// DeepSpeed; with smaller buckets every bucket is reducible on its own by
// one reduce-scatter, in flat order, while backward is still running.
#pragma once
#include <cstdint>
#include <vector>

namespace dsopt {

// A run of one parameter's elements that is contiguous in a shard.
struct ShardFragment {
  int64_t param;         // parameter index
  int64_t param_offset;  // first element inside the parameter
  int64_t shard_offset;  // first element inside the shard
  int64_t numel;
};

// A run of one parameter's elements that is contiguous in the flat index.
struct FlatRun {
  int64_t param;
  int64_t param_offset;
  int64_t numel;
};

struct ReduceBucket {
  int64_t flat_start;    // first flat element
  int64_t numel;         // a multiple of 2P; piece r is [flat_start + r*numel/P, +numel/P)
  int64_t shard_offset;  // where every rank's piece of this bucket starts in its shard
};

class ShardLayout {
 public:
  // numels: one per parameter, > 0. bucket_elems: reduce_bucket_size (>= 1),
  // rounded down to a multiple of 2P (at least 2P).
  ShardLayout(std::vector<int64_t> numels, int world, int64_t bucket_elems);

  int world() const { return world_; }
  int64_t flat_numel() const { return flat_; }      // n
  int64_t padded_numel() const { return padded_; }  // n'
  int64_t shard_numel() const { return padded_ / world_; }  // S
  int64_t bucket_elems() const { return bucket_; }  // B
  const std::vector<int64_t>& numels() const { return numels_; }
  const std::vector<ReduceBucket>& buckets() const { return buckets_; }

  // The parameter runs inside flat [begin, end), in flat order; elements at
  // or past n (padding) have none.
  std::vector<FlatRun> runs(int64_t begin, int64_t end) const;
  // Rank r's fragments in shard order.
  std::vector<ShardFragment> fragments(int rank) const;
  // Rank r's fragments that overlap shard range [begin, end), cut to it.
  std::vector<ShardFragment> fragments(int rank, int64_t begin, int64_t end) const;

 private:
  std::vector<int64_t> numels_;
  std::vector<int64_t> starts_;  // flat offset of each parameter
  int world_;
  int64_t flat_ = 0, padded_ = 0, bucket_ = 0;
  std::vector<ReduceBucket> buckets_;
};

}  // namespace dsopt
