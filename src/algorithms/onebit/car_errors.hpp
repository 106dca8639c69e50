// The rank-local error buffers of a compressed allreduce in the state blob
// (docs/design/decisions.md K1/K2), flat (comm/compressed_allreduce.hpp) or
// node-aware (comm/node_aware_allreduce.hpp): saved with the world size and
// the topology (N nodes of R ranks) that produced them, restored only under
// the same ones (zero otherwise). Shared by the 1-bit optimizers.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class CarErrors {
 public:
  // Reads the world size a (checked) blob recorded with its errors.
  using WorldReader = std::function<int32_t(const BlobReader&)>;

  // What the errors' lengths depend on: the world size (0: no errors) and
  // the ranks per node of the allreduce (1: the flat form; R > 1: the
  // node-aware form over N = world / R nodes, whose errors are those of the
  // flat form over N ranks on each tensor's slice of ceil(n / R) values).
  // onebit_node: the 1-bit node step (NodeAwareAllreduce), whose slices
  // are the node allreduce's chunks and whose node worker errors hold
  // padded_length(n, R) values per tensor; set only where it runs (N > 1,
  // R > 1).
  struct Layout {
    int32_t world = 0;
    int32_t ranks_per_node = 1;
    bool onebit_node = false;
    int32_t nodes() const { return ranks_per_node > 0 ? world / ranks_per_node : 0; }
    bool operator==(const Layout& o) const {
      return world == o.world &&
             (world <= 1 || (ranks_per_node == o.ranks_per_node && onebit_node == o.onebit_node));
    }
    bool operator!=(const Layout& o) const { return !(*this == o); }
  };
  // The padding rule a blob records with the layout: each tensor's slice
  // of m = ceil(n / R) values padded to padded_length(m, N)
  // (NodeAwareAllreduce; R = 1 is the flat form's padded_length(n, P));
  // with the 1-bit node step, the slices m = padded_length(n, R) / R and
  // the node worker errors (section <prefix>.node_error).
  static constexpr int32_t kSliceRule = 1;
  static constexpr int32_t kOneBitNodeRule = 2;

  // Sections <prefix>.topology, <prefix>.worker_error and
  // <prefix>.server_error (and <prefix>.node_error, saved with the 1-bit
  // node step) for tensors of the given sizes, whose blob
  // records their world size where `saved_world` reads it; `what` names the
  // rank-local state they are part of in dsopt_state_load's messages.
  // `fused`: one tensor of the sizes' values padded to the world's
  // padded_length (1-bit LAMB's fused momentum and its tail).
  CarErrors(std::string prefix, std::vector<int64_t> sizes, WorldReader saved_world,
            std::string what, bool fused = false)
      : prefix_(std::move(prefix)),
        sizes_(std::move(sizes)),
        saved_world_(std::move(saved_world)),
        what_(std::move(what)),
        fused_(fused) {}

  // The largest world size a blob may record for its errors: beyond it the
  // padded lengths (8 P^2 elements per tensor at most) would overflow.
  static constexpr int32_t kMaxWorld = int32_t(1) << 24;
  // Throws Error(DSOPT_ECORRUPT) unless `saved_world` is 0 (no errors) or in
  // [2, kMaxWorld].
  static void check_world(int32_t saved_world);

  // Bytes of the worker and server errors under `layout` (0 without
  // errors or on one node).
  std::pair<uint64_t, uint64_t> bytes(const Layout& layout) const;
  // Bytes of the 1-bit node step's node worker errors (0 without it).
  uint64_t node_bytes(const Layout& layout) const;
  // The world size blob `r` recorded with the errors.
  int32_t saved_world(const BlobReader& r) const { return saved_world_(r); }
  // The layout blob `r` recorded with the errors: its world size, and the
  // ranks per node of section <prefix>.topology (blobs without it: the
  // flat form, 1).
  Layout saved_layout(const BlobReader& r) const;
  // dsopt_state_load's description of blob `r`'s rank-local state: `what`
  // where its errors came from several ranks, else nothing.
  std::string rank_local_state(const BlobReader& r) const {
    return saved_world(r) > 1 ? what_ : std::string();
  }

  // The topology record and the sections of the errors of car() (none:
  // empty sections), as long as the layout a blob recorded with them
  // (saved_layout, its world already checked with check_world) says, the
  // live ones as `live()` says; restored into car() when `restore_if`. The
  // worker errors are the view "worker_error" through `slice`, listed while
  // `listed()`.
  // `node_errors()`: the node worker errors (nullptr without them).
  void describe(StateSchema& s, Kernels& kernels, std::function<CompressedAllreduce*()> car,
                std::function<float*()> node_errors, std::function<Layout()> live,
                std::function<bool(const BlobReader&)> restore_if, StateSchema::Slicer slice,
                std::function<bool()> listed) const;
  // Tensor t's part of a buffer of errors under `layout` on the rank of
  // local index `local`: the tensors back to back, each padded, holding
  // elements [local m, local m + m) of the tensor (m = ceil(n / R); all of
  // it where R = 1). Not found without a buffer.
  StateSchema::Slice tensor_slice(float* worker_errors, size_t t, const Layout& layout,
                                  int local) const;
  // The same for elements [first, first + numel) of the one fused tensor.
  StateSchema::Slice fused_slice(float* worker_errors, int64_t first, int64_t numel,
                                 const Layout& layout, int local) const;

 private:
  // Tensor t's length under `layout` before slicing.
  int64_t tensor_length(size_t t, const Layout& layout) const {
    return fused_ ? CompressedAllreduce::padded_length(sizes_[t], layout.world) : sizes_[t];
  }
  std::string prefix_;
  std::vector<int64_t> sizes_;
  WorldReader saved_world_;
  std::string what_;
  bool fused_;
};

}  // namespace dsopt
