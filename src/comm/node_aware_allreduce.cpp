#include "comm/node_aware_allreduce.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace dsopt {
namespace {

// The flat form's bytes per rank toward `peers` other ranks of a world of
// P (one all-to-all block and one allgathered chunk of every tensor, and
// two scales per tensor, to each peer).
uint64_t flat_bytes(const std::vector<int64_t>& sizes, int world, uint64_t peers) {
  uint64_t chunk_bytes = 0;
  for (int64_t n : sizes) chunk_bytes += uint64_t(CompressedAllreduce::padded_length(n, world) / world / 8);
  return peers * (2 * chunk_bytes + 8 * uint64_t(sizes.size()));
}

}  // namespace

uint64_t NodeAwareAllreduce::rail_bytes(const std::vector<int64_t>& sizes, int nodes,
                                        int ranks_per_node, bool onebit_node) {
  const bool onebit = onebit_node_step(onebit_node, nodes, ranks_per_node);
  std::vector<int64_t> slices;
  for (int64_t n : sizes) slices.push_back(slice_length(n, ranks_per_node, onebit));
  return flat_bytes(slices, nodes, uint64_t(nodes - 1));
}

uint64_t NodeAwareAllreduce::node_bytes(const std::vector<int64_t>& sizes, int nodes, int ranks_per_node,
                                        bool onebit_node) {
  const bool onebit = onebit_node_step(onebit_node, nodes, ranks_per_node);
  uint64_t block = 0, codes = 0, signs = 0;
  for (int64_t n : sizes) {
    const int64_t m = slice_length(n, ranks_per_node, onebit);
    block += uint64_t(m);
    codes += uint64_t(CompressedAllreduce::padded_length(m, nodes) / 8);
    signs += uint64_t(m / 8);  // one chunk of the node allreduce's signs
  }
  const uint64_t T = uint64_t(sizes.size());
  const uint64_t gathered = nodes == 1 ? 4 * block : codes + 4 * uint64_t(nodes) * T;
  const uint64_t reduced = onebit ? signs + 4 * T : 4 * block;
  return uint64_t(ranks_per_node - 1) * (reduced + gathered);
}

uint64_t NodeAwareAllreduce::flat_cross_node_bytes(const std::vector<int64_t>& sizes, int nodes,
                                                   int ranks_per_node) {
  const int world = nodes * ranks_per_node;
  return flat_bytes(sizes, world, uint64_t(world - ranks_per_node));
}

NodeAwareAllreduce::NodeAwareAllreduce(Comm& node, Comm& rail, Kernels& kernels, const Mem& mem,
                                       std::vector<int64_t> sizes, bool onebit_node,
                                       int64_t piece_blocks)
    : node_(node), kernels_(kernels), mem_(mem), nodes_(rail.size()),
      ranks_per_node_(node.size()), sizes_(std::move(sizes)) {
  const int R = ranks_per_node_;
  if (R == 1) {  // the flat form on the rail communicator, on the tensors themselves
    rail_car_ = std::make_unique<CompressedAllreduce>(rail, kernels, mem, sizes_, piece_blocks);
    return;
  }
  for (int64_t n : sizes_)
    if (n < 0) fail(DSOPT_EINTERNAL, "NodeAwareAllreduce: negative tensor size");
  if (onebit_node_step(onebit_node, nodes_, R)) {
    // The node allreduce's chunks are the slices, back to back in its
    // server errors. In (c) a tensor of R m values (no padding) takes the
    // other slices straight into x, any other one through blocks_.
    node_car_ = std::make_unique<CompressedAllreduce>(node, kernels, mem, sizes_, piece_blocks);
    for (int64_t n : sizes_) {
      offset_.push_back(block_);
      slice_.push_back(slice_length(n, R, true));
      in_place_.push_back(slice_.back() * R == n);
      block_offset_.push_back(in_place_.back() ? 0 : packed_);
      block_ += slice_.back();
      if (!in_place_.back()) packed_ += slice_.back();
    }
    rail_car_ = std::make_unique<CompressedAllreduce>(rail, kernels, mem, slice_, piece_blocks);
    blocks_ = DeviceBuffer(kernels, size_t(packed_) * size_t(R) * 4);
    codes_ = DeviceBuffer(kernels, size_t(rail_car_->result_code_bytes()) * size_t(R));
    scales_.resize(size_t(rail_car_->result_scale_count()) * size_t(R));
    return;
  }
  // The packed tensors' slices first, then the in-place ones' (run, (a)).
  int64_t pad = 0;
  offset_.assign(sizes_.size(), 0);
  for (int64_t n : sizes_) {
    slice_.push_back(slice_length(n, R));
    in_place_.push_back(in_place(n, R));
  }
  for (int pass = 0; pass < 2; ++pass)
    for (size_t t = 0; t < sizes_.size(); ++t) {
      if (in_place_[t] != (pass == 1)) continue;
      offset_[t] = block_;
      block_ += slice_[t];
      if (pass == 0) {
        packed_ = block_;
        pad = std::max(pad, slice_[t] * R - sizes_[t]);
      }
    }
  rail_car_ = std::make_unique<CompressedAllreduce>(rail, kernels, mem, slice_, piece_blocks);
  block_offset_ = offset_;
  blocks_ = DeviceBuffer(kernels, size_t(nodes_ == 1 ? block_ : packed_) * size_t(R) * 4);
  mine_ = DeviceBuffer(kernels, size_t(block_) * 4);
  if (nodes_ > 1) {
    codes_ = DeviceBuffer(kernels, size_t(rail_car_->result_code_bytes()) * size_t(R));
    scales_.resize(size_t(rail_car_->result_scale_count()) * size_t(R));
  }
  if (pad > 0) {
    zeros_ = DeviceBuffer(kernels, size_t(pad) * 4);
    kernels.fill_zero(zeros_.get(), zeros_.bytes());
  }
}

float* NodeAwareAllreduce::node_step(float* const* x) {
  // The 1-bit node step: the node allreduce's first half, this rank's
  // slices left in its server errors.
  if (node_car_) {
    node_car_->reduce_scatter(x);
    return node_car_->server_error();
  }
  // fp32: the packed tensors' block j of blocks_ = their slices j,
  // zero-padded (one pass, fl(x * 1) is x), reduce-scattered in one call;
  // an in-place tensor reduce-scattered from x itself. The mean,
  // fl(s * fl(1 / R)), in the sums' last pass.
  const int R = ranks_per_node_;
  const size_t T = sizes_.size();
  std::vector<TensorRef> parts;
  parts.reserve(2 * T * size_t(R));
  for (int j = 0; j < R; ++j)
    for (size_t t = 0; t < T; ++t) {
      if (in_place_[t]) continue;
      const int64_t m = slice_[t], first = j * m;
      const int64_t have = std::clamp<int64_t>(sizes_[t] - first, 0, m);
      if (have > 0) parts.push_back(TensorRef{x[t] + first, have, DType::F32});
      if (m - have > 0) parts.push_back(TensorRef{zeros_.get(), m - have, DType::F32});
    }
  const float inv = 1.0f / float(R);
  if (packed_ > 0) {
    kernels_.transform(parts.data(), int64_t(parts.size()), 1.0f, blocks_.floats(), nullptr);
    node_.reduce_scatter_scaled(blocks_.floats(), mine_.floats(), size_t(packed_), inv, mem_);
  }
  for (size_t t = 0; t < T; ++t)
    if (in_place_[t]) node_.reduce_scatter_scaled(x[t], mine_.floats() + offset_[t], size_t(slice_[t]), inv, mem_);
  return mine_.floats();
}

void NodeAwareAllreduce::run(float* const* x) {
  const int R = ranks_per_node_;
  if (R == 1) {
    rail_car_->run(x);
    return;
  }
  const size_t T = sizes_.size();
  if (block_ == 0) return;

  // (a) This rank's block: the slices y_j of every tensor.
  float* const own = node_step(x);

  // (b) Across nodes, on the slices; an in-place tensor's result straight
  // into its slice of x.
  std::vector<float*> slices(T), results(T);
  for (size_t t = 0; t < T; ++t) {
    slices[t] = own + offset_[t];
    results[t] = nodes_ > 1 && in_place_[t] ? x[t] + node_.rank() * slice_[t] : slices[t];
  }
  rail_car_->run(slices.data(), results.data());

  // (c) Every local index's slices, decoded from its rail's result (or
  // gathered in fp32 where nothing was compressed), back into the tensors:
  // an in-place tensor's straight into x.
  const int me = node_.rank();
  const int64_t stride = nodes_ == 1 ? block_ : packed_;
  if (nodes_ == 1) {
    node_.allgather(mine_.get(), blocks_.get(), size_t(block_), Elem::F32, mem_);
  } else {
    const CompressedAllreduce& rail = *rail_car_;
    const size_t code_bytes = size_t(rail.result_code_bytes()), scale_count = size_t(rail.result_scale_count());
    node_.allgather(rail.result_codes(), codes_.get(), code_bytes, Elem::U8, mem_);
    node_.allgather(rail.result_scales(), scales_.data(), scale_count, Elem::F32, Mem::host());
    for (int j = 0; j < R; ++j) {
      if (j == me) continue;
      for (size_t t = 0; t < T; ++t)
        slices[t] = in_place_[t] ? x[t] + j * slice_[t] : blocks_.floats() + j * stride + block_offset_[t];
      rail_car_->decode_result(static_cast<const uint8_t*>(codes_.get()) + size_t(j) * code_bytes,
                               scales_.data() + size_t(j) * scale_count, slices.data());
    }
  }
  std::vector<TensorRef> parts;
  parts.reserve(size_t(R));
  for (size_t t = 0; t < T; ++t) {
    parts.clear();
    if (nodes_ > 1 && in_place_[t]) continue;  // all its slices are in x
    for (int j = 0; j < R; ++j) {
      const int64_t m = slice_[t], first = j * m;
      const int64_t have = std::clamp<int64_t>(sizes_[t] - first, 0, m);
      const float* block = nodes_ > 1 && j == me ? own + offset_[t]
                                                 : blocks_.floats() + j * stride + block_offset_[t];
      if (have > 0) parts.push_back(TensorRef{block, have, DType::F32});
    }
    if (!parts.empty()) kernels_.transform(parts.data(), int64_t(parts.size()), 1.0f, x[t], nullptr);
  }
  // The node allreduce's server errors back to zero for the next call.
  if (node_car_) kernels_.fill_zero(own, size_t(block_) * 4);
}

}  // namespace dsopt
