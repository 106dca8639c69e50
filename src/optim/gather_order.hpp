// The order in which ZeRO's deferred parameter allgather posts its buckets
// (dsopt_gather_order; docs/guides/zero.md "Deferred allgather"). The
// buckets are the gatherer's chunks, which follow the shard layout; a
// caller that needs the parameters in another order (the model's forward
// order) gives that order, and the chunks are posted in the order in which
// the parameters first need them. Buckets are then numbered by position in
// that sequence: a parameter is whole once the last position among the
// chunks that write it has arrived. Each chunk writes its own elements, so
// the order changes when values arrive, never what they are.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dsopt {

class GatherOrder {
 public:
  // "" when `order` holds `count` distinct parameter indices 0 .. params-1
  // (a permutation), or when count is 0 (the default order); else what is
  // wrong, in words.
  static std::string check(const int64_t* order, int64_t count, int64_t params);
  // A hash of a checked order of `params` parameters, equal on ranks that
  // passed the same order (the default's is the identity's).
  static uint64_t fingerprint(const int64_t* order, int64_t count, int64_t params);

  // Sets a checked order for `chunks` chunks, chunks_of(i) listing the
  // chunks that write parameter i (ascending). Count 0 or the identity:
  // the default order, chunk c at position c.
  void set(const int64_t* order, int64_t count, int64_t chunks,
           const std::function<std::vector<int64_t>(int64_t)>& chunks_of);
  // The chunk posted at `position`.
  int64_t chunk_at(int64_t position) const {
    return sequence_.empty() ? position : sequence_[size_t(position)];
  }
  // The position after which the chunks `chunks` have all arrived (-1
  // when there are none: the parameter is never gathered).
  int64_t last_position(const std::vector<int64_t>& chunks) const;

 private:
  std::vector<int64_t> sequence_;  // chunk at each position (empty: c at c)
  std::vector<int64_t> position_;  // position of each chunk (empty: c at c)
};

}  // namespace dsopt
