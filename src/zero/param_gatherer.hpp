// ZeRO's parameter path (docs/design/zero.md section 6.2): after the update every
// rank holds the new values of its own shard in the caller's buffers; an
// allgather of the shards, in chunks of allgather_bucket_size elements,
// writes every other rank's values into them. The wire carries the
// parameters' own bytes: 2 per element when every parameter is 16-bit, 4
// otherwise (16-bit values then travel widened, exactly).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/device_buffer.hpp"
#include "params/param_set.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

class ParamGatherer {
 public:
  // `scratch` (device memory of at least scratch_bytes(...)) holds a chunk
  // during gather(); it is free between calls.
  ParamGatherer(const ShardLayout& layout, int64_t chunk_elems, Comm& comm, Kernels& kernels,
                const Mem& mem, const ParamSet& params, void* scratch);
  static size_t scratch_bytes(const ShardLayout& layout, int64_t chunk_elems, const ParamSet& params);
  // Collective: every rank's shard of the parameters into every rank's
  // buffers.
  void gather();

 private:
  struct Chunk {
    int64_t begin, end;                               // shard offsets
    std::vector<std::vector<ShardFragment>> by_rank;  // each rank's fragments in it
  };
  void* element(const ShardFragment& f) const;  // the caller's first element of f
  static size_t wire_bytes(const ParamSet& params);
  static int64_t chunk_length(const ShardLayout& layout, int64_t chunk_elems);

  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  const ParamSet& params_;
  int world_, rank_;
  size_t wire_ = 4;  // bytes per element on the wire
  std::vector<Chunk> chunks_;
  uint8_t* send_;  // scratch: this rank's chunk, then every rank's
  uint8_t* recv_;
};

}  // namespace dsopt
