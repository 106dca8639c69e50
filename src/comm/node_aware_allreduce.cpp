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
                                        int ranks_per_node) {
  std::vector<int64_t> slices;
  for (int64_t n : sizes) slices.push_back(slice_length(n, ranks_per_node));
  return flat_bytes(slices, nodes, uint64_t(nodes - 1));
}

uint64_t NodeAwareAllreduce::node_bytes(const std::vector<int64_t>& sizes, int ranks_per_node) {
  uint64_t block = 0;
  for (int64_t n : sizes) block += uint64_t(slice_length(n, ranks_per_node));
  return 2 * uint64_t(ranks_per_node - 1) * 4 * block;
}

uint64_t NodeAwareAllreduce::flat_cross_node_bytes(const std::vector<int64_t>& sizes, int nodes,
                                                   int ranks_per_node) {
  const int world = nodes * ranks_per_node;
  return flat_bytes(sizes, world, uint64_t(world - ranks_per_node));
}

NodeAwareAllreduce::NodeAwareAllreduce(Comm& node, Comm& rail, Kernels& kernels, const Mem& mem,
                                       std::vector<int64_t> sizes, int64_t piece_blocks)
    : node_(node), kernels_(kernels), mem_(mem), nodes_(rail.size()),
      ranks_per_node_(node.size()), sizes_(std::move(sizes)) {
  const int R = ranks_per_node_;
  if (R == 1) {  // the flat form on the rail communicator, on the tensors themselves
    rail_car_ = std::make_unique<CompressedAllreduce>(rail, kernels, mem, sizes_, piece_blocks);
    return;
  }
  int64_t pad = 0;
  for (int64_t n : sizes_) {
    if (n < 0) fail(DSOPT_EINTERNAL, "NodeAwareAllreduce: negative tensor size");
    const int64_t m = slice_length(n, R);
    offset_.push_back(block_);
    slice_.push_back(m);
    block_ += m;
    pad = std::max(pad, m * R - n);
  }
  rail_car_ = std::make_unique<CompressedAllreduce>(rail, kernels, mem, slice_, piece_blocks);
  blocks_ = DeviceBuffer(kernels, size_t(block_) * size_t(R) * 4);
  mine_ = DeviceBuffer(kernels, size_t(block_) * 4);
  if (pad > 0) {
    zeros_ = DeviceBuffer(kernels, size_t(pad) * 4);
    kernels.fill_zero(zeros_.get(), zeros_.bytes());
  }
}

void NodeAwareAllreduce::run(float* const* x) {
  const int R = ranks_per_node_;
  if (R == 1) {
    rail_car_->run(x);
    return;
  }
  const size_t T = sizes_.size();
  if (block_ == 0) return;

  // (a) Block j of blocks_ = slice j of every tensor, zero-padded: one pass
  // (fl(x * 1) is x), then the fixed-order reduce-scatter and the mean.
  std::vector<TensorRef> parts;
  parts.reserve(2 * T * size_t(R));
  for (int j = 0; j < R; ++j)
    for (size_t t = 0; t < T; ++t) {
      const int64_t m = slice_[t], first = j * m;
      const int64_t have = std::clamp<int64_t>(sizes_[t] - first, 0, m);
      if (have > 0) parts.push_back(TensorRef{x[t] + first, have, DType::F32});
      if (m - have > 0) parts.push_back(TensorRef{zeros_.get(), m - have, DType::F32});
    }
  kernels_.transform(parts.data(), int64_t(parts.size()), 1.0f, blocks_.floats(), nullptr);
  node_.reduce_scatter(blocks_.get(), mine_.get(), size_t(block_), Elem::F32, ReduceOp::Sum, mem_);
  const TensorRef sums{mine_.get(), block_, DType::F32};
  kernels_.transform(&sums, 1, 1.0f / float(R), mine_.floats(), nullptr);

  // (b) Across nodes, on the slices.
  std::vector<float*> slices(T);
  for (size_t t = 0; t < T; ++t) slices[t] = mine_.floats() + offset_[t];
  rail_car_->run(slices.data());

  // (c) Every rank's decompressed slices, back into the tensors.
  node_.allgather(mine_.get(), blocks_.get(), size_t(block_), Elem::F32, mem_);
  for (size_t t = 0; t < T; ++t) {
    parts.clear();
    for (int j = 0; j < R; ++j) {
      const int64_t m = slice_[t], first = j * m;
      const int64_t have = std::clamp<int64_t>(sizes_[t] - first, 0, m);
      if (have > 0)
        parts.push_back(TensorRef{blocks_.floats() + size_t(j) * size_t(block_) + offset_[t], have, DType::F32});
    }
    if (!parts.empty()) kernels_.transform(parts.data(), int64_t(parts.size()), 1.0f, x[t], nullptr);
  }
}

}  // namespace dsopt
