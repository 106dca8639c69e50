// ZeRO's parameter path (docs/design/zero.md section 6.2): after the update every
// rank holds the new values of its own shard in the caller's buffers; an
// allgather of the shards, in chunks of allgather_bucket_size elements,
// writes every other rank's values into them. The wire carries the
// parameters' own bytes: 2 per element when every parameter is 16-bit, 4
// otherwise (16-bit values then travel widened, exactly).
//
// With a parameter codec (docs/guides/compressed-zero.md) the owner encodes
// its chunk from the fp32 masters of its shard instead (bf16, or int8 in
// scaled blocks), and every rank, the owner included, writes the decoded
// values into its buffers: the replicas stay bit-identical. The encoded
// chunks and a decoded one take the scratch the uncompressed form uses.
// The int8 codec's chunks are whole blocks (but the shard's last one), so
// its blocks start at the same shard offsets whatever the bucket size: the
// values do not depend on it.
//
// Node-aware (set_hierarchy, docs/design/node-aware-zero.md): a chunk's
// codes are allgathered over the rail communicator first (the owners of
// local index j on every node), then the N codes each rank holds over the
// node communicator; every rank decodes the same P codes.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "comm/topology.hpp"
#include "kernels/device_buffer.hpp"
#include "params/param_set.hpp"
#include "zero/compression.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

class ParamGatherer {
 public:
  // `codec` (None: the parameters' own bytes) with `block`, its block for
  // int8; `scratch` (device memory of at least scratch_bytes(...) for the
  // same arguments) holds a chunk during gather(); it is free between calls.
  ParamGatherer(const ShardLayout& layout, int64_t chunk_elems, ParamCodec codec, int64_t block,
                Comm& comm, Kernels& kernels, const Mem& mem, const ParamSet& params, void* scratch);
  // With a codec: the masters whose chunks it encodes (S floats in shard
  // order, device memory); before the first gather.
  void set_masters(const float* masters);
  static size_t scratch_bytes(const ShardLayout& layout, int64_t chunk_elems, const ParamSet& params,
                              ParamCodec codec, int64_t block);
  // Collective: every rank's shard of the parameters into every rank's
  // buffers (every chunk in order).
  void gather();
  // The same, chunk by chunk (docs/guides/zero.md "Deferred allgather"):
  // gather_chunk(c) for c = 0 .. chunks()-1, in that order on every rank,
  // does what gather() does. Chunk c uses the scratch while it runs.
  int64_t chunks() const { return int64_t(chunks_.size()); }
  void gather_chunk(int64_t c);
  // The chunks that write parameter i, ascending (none at one rank): the
  // parameter is whole once they have all run. Chunk c covers the same
  // shard offsets on every rank, so a parameter whose elements lie in
  // several ranks' shards may be written by chunks far apart.
  const std::vector<int64_t>& chunks_of(int64_t param) const {
    static const std::vector<int64_t> none;
    return chunks_of_.empty() ? none : chunks_of_[size_t(param)];
  }
  // Bytes this rank contributes to one gather(): each chunk's piece, which
  // the allgather sends to every other rank (Comm::allgather_bytes).
  uint64_t send_bytes_per_gather() const;
  // What one gather() counts on `comm` (the world communicator), node-aware
  // included: for a deferred gather, counted when it is posted.
  CommBytes bytes_per_gather(const Comm& comm) const;
  // Collective layout choice at creation: with a parameter codec and R > 1
  // the codes travel over `t`'s rail, then node communicators (which must
  // outlive this gatherer). No-op otherwise.
  void set_hierarchy(const Topology& t, Comm& node, Comm& rail);
  bool hierarchical() const { return node_ != nullptr; }

 private:
  struct Chunk {
    int64_t begin, end;                               // shard offsets
    std::vector<std::vector<ShardFragment>> by_rank;  // each rank's fragments in it
  };
  void* element(const ShardFragment& f) const;  // the caller's first element of f
  // Bytes of a chunk of len elements on the wire (w per element uncompressed).
  static int64_t encoded_bytes(ParamCodec codec, int64_t block, size_t w, int64_t len);
  void gather_compressed(const Chunk& c);
  void gather_plain(const Chunk& c);
  // Writes fp32 values of chunk c's fragments of rank r into the buffers.
  void scatter(const Chunk& c, int r, const float* values);
  static size_t wire_bytes(const ParamSet& params);
  // Elements of a chunk: allgather_bucket_size / P, at most the shard;
  // with int8 a multiple of its block, at least one.
  static int64_t chunk_length(const ShardLayout& layout, int64_t chunk_elems, ParamCodec codec,
                              int64_t block);

  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  const ParamSet& params_;
  int world_, rank_;
  size_t wire_ = 4;  // bytes per element on the wire
  std::vector<Chunk> chunks_;
  std::vector<std::vector<int64_t>> chunks_of_;  // per parameter (empty at one rank)
  int64_t chunk_ = 0;  // elements of the longest chunk
  uint8_t* scratch_;   // this rank's chunk, then every rank's
  // With a parameter codec: the codec, its block, the masters, and in the
  // scratch one decoded chunk, then the encoded ones.
  ParamCodec codec_ = ParamCodec::None;
  int64_t block_ = 0;
  const float* masters_ = nullptr;
  // Node-aware: the communicators, N, R, the rank of (node k, local j) at
  // rank_of_[k * R + j], and the codes: this rank's chunk, the rail's N,
  // the node's R N (the longest chunk's).
  Comm* node_ = nullptr;
  Comm* rail_ = nullptr;
  int nodes_ = 1, per_node_ = 1;
  std::vector<int> rank_of_;
  DeviceBuffer codes_;
};

}  // namespace dsopt
