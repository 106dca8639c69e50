#include "zero/param_gatherer.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace dsopt {

size_t ParamGatherer::wire_bytes(const ParamSet& params) {
  for (const Param& p : params.params())
    if (p.dtype == DType::F32) return 4;
  return 2;
}

int64_t ParamGatherer::chunk_length(const ShardLayout& layout, int64_t chunk_elems, ParamCodec codec,
                                    int64_t block) {
  int64_t len = std::max<int64_t>(1, chunk_elems / layout.world());
  if (codec == ParamCodec::Int8) len = std::max(block, len / block * block);
  return std::min(layout.shard_numel(), len);
}

size_t ParamGatherer::scratch_bytes(const ShardLayout& layout, int64_t chunk_elems,
                                    const ParamSet& params, ParamCodec codec, int64_t block) {
  if (layout.world() == 1) return 0;  // the update already wrote every element
  const int64_t len = chunk_length(layout, chunk_elems, codec, block);
  const size_t coded = size_t(encoded_bytes(codec, block, wire_bytes(params), len)) * size_t(layout.world() + 1);
  return codec == ParamCodec::None ? coded : size_t(len) * 4 + coded;
}

ParamGatherer::ParamGatherer(const ShardLayout& layout, int64_t chunk_elems, ParamCodec codec,
                             int64_t block, Comm& comm, Kernels& kernels, const Mem& mem,
                             const ParamSet& params, void* scratch)
    : comm_(comm), kernels_(kernels), mem_(mem), params_(params), world_(layout.world()),
      rank_(comm.rank()), wire_(wire_bytes(params)), scratch_(static_cast<uint8_t*>(scratch)) {
  if (world_ == 1) return;
  codec_ = codec;
  block_ = block;
  const int64_t shard = layout.shard_numel();
  chunk_ = chunk_length(layout, chunk_elems, codec, block);
  for (int64_t begin = 0; begin < shard; begin += chunk_) {
    Chunk c{begin, std::min(shard, begin + chunk_), {}};
    for (int r = 0; r < world_; ++r) c.by_rank.push_back(layout.fragments(r, c.begin, c.end));
    chunks_.push_back(std::move(c));
  }
  chunks_of_.assign(size_t(params.count()), {});
  for (size_t c = 0; c < chunks_.size(); ++c)
    for (const auto& fragments : chunks_[c].by_rank)
      for (const ShardFragment& f : fragments) {
        std::vector<int64_t>& of = chunks_of_[size_t(f.param)];
        if (of.empty() || of.back() != int64_t(c)) of.push_back(int64_t(c));
      }
}

uint64_t ParamGatherer::send_bytes_per_gather() const {
  uint64_t bytes = 0;
  for (const Chunk& c : chunks_) bytes += uint64_t(encoded_bytes(codec_, block_, wire_, c.end - c.begin));
  return bytes;
}

CommBytes ParamGatherer::bytes_per_gather(const Comm& comm) const {
  if (!hierarchical()) return comm.allgather_bytes(send_bytes_per_gather());
  CommBytes b;
  for (const Chunk& c : chunks_) {
    const uint64_t bytes = uint64_t(encoded_bytes(codec_, block_, wire_, c.end - c.begin));
    b += rail_->allgather_bytes(bytes) + node_->allgather_bytes(uint64_t(nodes_) * bytes);
  }
  return b;
}

void ParamGatherer::set_hierarchy(const Topology& t, Comm& node, Comm& rail) {
  if (codec_ == ParamCodec::None || t.ranks_per_node < 2 || world_ == 1) return;
  if (t.world() != world_ || node.size() != t.ranks_per_node || rail.size() != t.nodes)
    fail(DSOPT_EINTERNAL, "ParamGatherer::set_hierarchy: topology " + t.describe() + " for " +
                              std::to_string(world_) + " ranks");
  node_ = &node;
  rail_ = &rail;
  nodes_ = t.nodes;
  per_node_ = t.ranks_per_node;
  rank_of_.assign(size_t(world_), -1);
  std::vector<int> seen(size_t(nodes_), 0);
  for (int r = 0; r < world_; ++r) {
    const int k = t.node_of_rank[size_t(r)];
    rank_of_[size_t(k * per_node_ + seen[size_t(k)]++)] = r;
  }
  const size_t bytes = size_t(encoded_bytes(codec_, block_, wire_, chunk_));
  codes_ = DeviceBuffer(kernels_, bytes * size_t(1 + nodes_ + world_));
}

void* ParamGatherer::element(const ShardFragment& f) const {
  const Param& p = params_.params()[size_t(f.param)];
  return static_cast<uint8_t*>(p.data) + f.param_offset * int64_t(dtype_size(p.dtype));
}

void ParamGatherer::set_masters(const float* masters) { masters_ = masters; }

int64_t ParamGatherer::encoded_bytes(ParamCodec codec, int64_t block, size_t w, int64_t len) {
  if (codec == ParamCodec::Bf16) return 2 * len;
  if (codec == ParamCodec::Int8) return codec_run_bytes(BlockCodec::Int8, block, len);
  return int64_t(w) * len;
}

void ParamGatherer::scatter(const Chunk& c, int r, const float* values) {
  for (const ShardFragment& f : c.by_rank[size_t(r)]) {
    const float* src = values + (f.shard_offset - c.begin);
    const DType dt = params_.params()[size_t(f.param)].dtype;
    if (dt == DType::F32)
      kernels_.copy(element(f), src, size_t(f.numel) * 4);
    else
      kernels_.from_float(src, element(f), dt, f.numel);
  }
}

void ParamGatherer::gather_compressed(const Chunk& c) {
  float* decoded = reinterpret_cast<float*>(scratch_);
  uint8_t* send = hierarchical() ? static_cast<uint8_t*>(codes_.get()) : scratch_ + size_t(chunk_) * 4;
  {
    const int64_t len = c.end - c.begin;
    const int64_t bytes = encoded_bytes(codec_, block_, wire_, len);
    uint8_t* recv = send + bytes;
    if (codec_ == ParamCodec::Bf16)
      kernels_.from_float(masters_ + c.begin, send, DType::BF16, len);
    else
      kernels_.codec_encode(BlockCodec::Int8, block_, masters_ + c.begin, nullptr, 1.0f, nullptr, len,
                            1, send);
    // Where rank r's codes arrive: block r, or node-aware, block
    // (j, k) = j N + k of the node's allgather for r = (node k, local j).
    std::vector<size_t> at(static_cast<size_t>(world_), 0);
    if (hierarchical()) {
      uint8_t* across = recv;                                 // N codes, node order
      uint8_t* inside = across + size_t(nodes_) * size_t(bytes);  // R times those, local order
      rail_->allgather(send, across, size_t(bytes), Elem::U8, mem_);
      node_->allgather(across, inside, size_t(nodes_) * size_t(bytes), Elem::U8, mem_);
      for (int k = 0; k < nodes_; ++k)
        for (int j = 0; j < per_node_; ++j)
          at[size_t(rank_of_[size_t(k * per_node_ + j)])] =
              size_t(nodes_ + j * nodes_ + k) * size_t(bytes);
    } else {
      comm_.allgather(send, recv, size_t(bytes), Elem::U8, mem_);
      for (int r = 0; r < world_; ++r) at[size_t(r)] = size_t(r) * size_t(bytes);
    }
    for (int r = 0; r < world_; ++r) {
      const uint8_t* from = recv + at[size_t(r)];
      if (codec_ == ParamCodec::Bf16)
        kernels_.to_float(TensorRef{from, len, DType::BF16}, decoded);
      else
        kernels_.codec_decode_sum(BlockCodec::Int8, block_, from, 1, len, decoded);
      scatter(c, r, decoded);
    }
  }
}

void ParamGatherer::gather() {
  for (int64_t c = 0; c < chunks(); ++c) gather_chunk(c);
}

void ParamGatherer::gather_chunk(int64_t c) {
  if (codec_ != ParamCodec::None)
    gather_compressed(chunks_[size_t(c)]);
  else
    gather_plain(chunks_[size_t(c)]);
}

void ParamGatherer::gather_plain(const Chunk& c) {
  uint8_t* send = scratch_;
  uint8_t* recv = scratch_ + size_t(chunk_) * wire_;
  {
    const int64_t len = c.end - c.begin;
    int64_t covered = 0;
    for (const ShardFragment& f : c.by_rank[size_t(rank_)]) {
      uint8_t* dst = send + size_t(f.shard_offset - c.begin) * wire_;
      const DType dt = params_.params()[size_t(f.param)].dtype;
      if (dtype_size(dt) == wire_)
        kernels_.copy(dst, element(f), size_t(f.numel) * wire_);
      else
        kernels_.to_float(TensorRef{element(f), f.numel, dt}, reinterpret_cast<float*>(dst));
      covered += f.numel;
    }
    if (covered < len) {  // padding: zeros, so that every rank sends defined bytes
      const int64_t tail = c.by_rank[size_t(rank_)].empty()
                               ? 0
                               : c.by_rank[size_t(rank_)].back().shard_offset +
                                     c.by_rank[size_t(rank_)].back().numel - c.begin;
      kernels_.fill_zero(send + size_t(tail) * wire_, size_t(len - tail) * wire_);
    }
    comm_.allgather(send, recv, size_t(len) * wire_, Elem::U8, mem_);
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const uint8_t* from = recv + size_t(r) * size_t(len) * wire_;
      for (const ShardFragment& f : c.by_rank[size_t(r)]) {
        const uint8_t* src = from + size_t(f.shard_offset - c.begin) * wire_;
        const DType dt = params_.params()[size_t(f.param)].dtype;
        if (dtype_size(dt) == wire_)
          kernels_.copy(element(f), src, size_t(f.numel) * wire_);
        else
          kernels_.from_float(reinterpret_cast<const float*>(src), element(f), dt, f.numel);
      }
    }
  }
}

}  // namespace dsopt
