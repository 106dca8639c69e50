// The node-aware error-compensated 1-bit compressed allreduce
// (docs/design/node-aware-allreduce.md), built on Comm and Kernels like the
// flat one (comm/compressed_allreduce.hpp), which it runs across nodes.
//
// With N nodes of R ranks, rank (node k, local j) in one call:
//   (a) inside the node, fp32, uncompressed: each tensor x (n values) is
//       padded with zeros to R*m, m = ceil(n / R), and reduce-scattered over
//       the node communicator in dsopt's fixed order (comm.hpp): local rank
//       j receives slice j of every tensor, s = sum over the node's ranks,
//       and keeps y_j = fl(s * fl(1 / R)), the node mean of slice j. The
//       tensors are packed into one collective, but for those whose n is a
//       multiple of R with slices of at least kInPlaceSlice values: each of
//       these is reduce-scattered from x itself, no copy made;
//   (b) across nodes, compressed: the flat CompressedAllreduce over the
//       rail communicator (the N ranks of local index j) on the slices y_j
//       (one tensor of m values per tensor): worker error of
//       padded_length(m, N), server error of padded_length(m, N) / N;
//   (c) inside the node, compressed as they crossed: the rail allreduce's
//       result as it arrived at every rail rank (the N ranks' server signs
//       and scales, sum_t n''_t / 8 bytes and 4 N T) allgathered over the
//       node communicator; every rank decodes the other local indices'
//       slices exactly as their rail decoded them and writes the n values
//       of each x (an in-place tensor's slices all decoded straight into
//       x, its own by the rail allreduce of (b)). With N = 1 (nothing
//       compressed) the node means are allgathered in fp32.
// Every rank ends with the same bits. R = 1 is the flat form on the rail
// communicator exactly (the tensors go to it as they are); N = 1 runs (a)
// and (c) only (the rail allreduce of one rank is the identity).
//
// The 1-bit node step (onebit_node, with N > 1 and R > 1) replaces (a) by
// the first half of the flat compressed allreduce over the node
// communicator (CompressedAllreduce::reduce_scatter): each rank compresses
// its whole tensors with a node worker error of padded_length(n, R)
// values, the signs go to their owners inside the node, and local rank j
// keeps y_j = the average of the decoded signs of its chunk (the slices are
// the node allreduce's chunks, m = padded_length(n, R) / R; a tensor with
// n = R m, no padding, gets the other slices decoded straight into x in
// (c), with no part in blocks_). (b) and (c) are unchanged. For nodes whose links are slow beside their
// arithmetic: the node carries sum_t n_t / 8 bytes of signs instead of
// 4 sum_t m_t of fp32, for one more compression and a node worker error as
// long as the flat form's.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/comm.hpp"
#include "comm/compressed_allreduce.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {

class NodeAwareAllreduce {
 public:
  // m: the slice length of a tensor of n values on nodes of R ranks
  // (onebit_node: the node allreduce's chunk, padded_length(n, R) / R).
  static int64_t slice_length(int64_t n, int ranks_per_node, bool onebit_node = false) {
    if (onebit_node && ranks_per_node > 1)
      return CompressedAllreduce::padded_length(n, ranks_per_node) / ranks_per_node;
    return (n + ranks_per_node - 1) / ranks_per_node;
  }
  // Whether the 1-bit node step runs on N nodes of R ranks when asked for.
  static bool onebit_node_step(bool asked, int nodes, int ranks_per_node) {
    return asked && nodes > 1 && ranks_per_node > 1;
  }
  // Tensors reduce-scattered in place, not packed: n a multiple of R, and
  // slices of at least kInPlaceSlice values (a collective of their own is
  // worth a copy of n values saved).
  static constexpr int64_t kInPlaceSlice = int64_t(1) << 16;
  static bool in_place(int64_t n, int ranks_per_node) {
    return n % ranks_per_node == 0 && n / ranks_per_node >= kInPlaceSlice;
  }

  // Bytes one call adds to the rail communicator's bytes_sent on every rank
  // (what crosses node boundaries): with n''_t = padded_length(m_t, N) and
  // T tensors, (N - 1) * (2 * sum_t n''_t / (8 N) + 8 T); 0 when N = 1.
  static uint64_t rail_bytes(const std::vector<int64_t>& sizes, int nodes, int ranks_per_node,
                             bool onebit_node = false);
  // Bytes one call adds to the node communicator's bytes_sent on every rank:
  // the reduce-scatter, (R - 1) * 4 * sum_t m_t, and the allgather,
  // (R - 1) * (sum_t n''_t / 8 + 4 N T) (N = 1: (R - 1) * 4 * sum_t m_t);
  // 0 when R = 1. The 1-bit node step sends instead of the reduce-scatter
  // (R - 1) * (sum_t n'_t / (8 R) + 4 T), n'_t = padded_length(n_t, R).
  static uint64_t node_bytes(const std::vector<int64_t>& sizes, int nodes, int ranks_per_node,
                             bool onebit_node = false);
  // The flat form's bytes on the same world (P = N R) that go to ranks of
  // other nodes when every block goes straight to its destination:
  // (P - R) * (2 * sum_t n'_t / (8 P) + 8 T), n'_t = padded_length(n_t, P).
  static uint64_t flat_cross_node_bytes(const std::vector<int64_t>& sizes, int nodes,
                                        int ranks_per_node);

  // Tensors of the given sizes; `node` and `rail` as comm/topology.hpp
  // makes them (node: the R ranks of this node ranked by local index; rail:
  // the N ranks of this local index ranked by node). Buffers in
  // mem.kernels' memory; error buffers start at zero. piece_blocks: the
  // rail allreduce's pieces (compressed_allreduce.hpp).
  NodeAwareAllreduce(Comm& node, Comm& rail, Kernels& kernels, const Mem& mem,
                     std::vector<int64_t> sizes, bool onebit_node = false, int64_t piece_blocks = 0);

  // Collective over both communicators: x[t] (sizes[t] fp32 values each)
  // becomes the compressed average over all N R ranks, identical on every
  // rank.
  void run(float* const* x);

  int nodes() const { return nodes_; }
  bool onebit_node() const { return node_car_ != nullptr; }
  int ranks_per_node() const { return ranks_per_node_; }
  int64_t count() const { return int64_t(sizes_.size()); }
  // The rail allreduce over the slices (over the tensors themselves when
  // R = 1): its worker errors (n''_t each, back to back) and server errors
  // (n''_t / N each) are this rank's error-feedback state.
  CompressedAllreduce& rail_allreduce() { return *rail_car_; }
  float* worker_error() const { return rail_car_->worker_error(); }
  int64_t worker_error_numel() const { return rail_car_->worker_error_numel(); }
  float* server_error() const { return rail_car_->server_error(); }
  int64_t server_error_numel() const { return rail_car_->server_error_numel(); }
  // The 1-bit node step's worker errors (padded_length(n_t, R) each, back
  // to back; none without it).
  float* node_error() const { return node_car_ ? node_car_->worker_error() : nullptr; }
  int64_t node_error_numel() const { return node_car_ ? node_car_->worker_error_numel() : 0; }
  void reset_errors() {
    rail_car_->reset_errors();
    if (node_car_) node_car_->reset_errors();
  }

 private:
  Comm& node_;
  Kernels& kernels_;
  Mem mem_;
  int nodes_, ranks_per_node_;
  std::vector<int64_t> sizes_;
  std::vector<int64_t> slice_;   // m_t
  std::vector<int64_t> offset_;  // of slice t in mine_: the packed tensors' first
  std::vector<bool> in_place_;
  int64_t block_ = 0;            // sum_t m_t: mine_
  int64_t packed_ = 0;           // the packed tensors' sum_t m_t
  std::vector<int64_t> block_offset_;  // of slice t in each of blocks_' R blocks (packed tensors)
  // (a) of run: this rank's block of slices (in mine_, or the 1-bit node
  // step's in node_car_'s server errors).
  float* node_step(float* const* x);

  std::unique_ptr<CompressedAllreduce> rail_car_;
  std::unique_ptr<CompressedAllreduce> node_car_;  // the 1-bit node step's
  DeviceBuffer blocks_;  // R blocks of the packed tensors (N = 1: of all): (a)'s input, (c)'s slices
  DeviceBuffer codes_;   // (c): the R rail results' signs
  std::vector<float> scales_;  // (c): the R rail results' scales
  DeviceBuffer mine_;    // this rank's block: the slices y_j of every tensor (the 1-bit
                         // node step: node_car_'s server errors hold them)
  DeviceBuffer zeros_;   // the padding of the last slices (fewer than R values per tensor)
};

}  // namespace dsopt
