#include "algorithms/onebit/car_errors.hpp"

#include <algorithm>

#include "base/error.hpp"
#include "comm/node_aware_allreduce.hpp"

namespace dsopt {
namespace {
// <prefix>.topology: ranks per node, nodes, padding rule (int32 each); all
// zero where the blob has no errors.
constexpr uint64_t kTopologyBytes = 12;
}  // namespace

std::pair<uint64_t, uint64_t> CarErrors::bytes(const Layout& layout) const {
  const int32_t R = layout.ranks_per_node, N = layout.nodes();
  if (layout.world <= 1 || N <= 1) return {0, 0};
  uint64_t worker = 0;
  for (size_t t = 0; t < sizes_.size(); ++t)
    worker += uint64_t(CompressedAllreduce::padded_length(
                  NodeAwareAllreduce::slice_length(tensor_length(t, layout), R, layout.onebit_node), N)) * 4;
  return {worker, worker / uint64_t(N)};
}

uint64_t CarErrors::node_bytes(const Layout& layout) const {
  if (layout.world <= 1 || layout.nodes() <= 1 || !layout.onebit_node) return 0;
  uint64_t node = 0;
  for (size_t t = 0; t < sizes_.size(); ++t)
    node += uint64_t(CompressedAllreduce::padded_length(tensor_length(t, layout), layout.ranks_per_node)) * 4;
  return node;
}

CarErrors::Layout CarErrors::saved_layout(const BlobReader& r) const {
  Layout l{saved_world(r), 1};
  const std::string name = prefix_ + ".topology";
  if (l.world > 1 && r.has(name)) {
    FieldReader f(r.section(name, kTopologyBytes), kTopologyBytes);
    l.ranks_per_node = f.get<int32_t>();
    f.get<int32_t>();
    l.onebit_node = f.get<int32_t>() == kOneBitNodeRule;
  }
  return l;
}

StateSchema::Slice CarErrors::tensor_slice(float* worker_errors, size_t t, const Layout& layout,
                                           int local) const {
  if (!worker_errors || t >= sizes_.size()) return {};
  const int32_t R = layout.ranks_per_node, N = layout.nodes();
  int64_t at = 0;
  const bool onebit = layout.onebit_node;
  for (size_t u = 0; u < t; ++u)
    at += CompressedAllreduce::padded_length(NodeAwareAllreduce::slice_length(sizes_[u], R, onebit), N);
  const int64_t m = NodeAwareAllreduce::slice_length(sizes_[t], R, onebit), first = int64_t(local) * m;
  const int64_t have = std::clamp<int64_t>(sizes_[t] - first, 0, m);
  return {true, worker_errors + at, have, have > 0 ? first : 0};
}

StateSchema::Slice CarErrors::fused_slice(float* worker_errors, int64_t first, int64_t numel,
                                          const Layout& layout, int local) const {
  if (!worker_errors || sizes_.empty()) return {};
  const int64_t m =
      NodeAwareAllreduce::slice_length(tensor_length(0, layout), layout.ranks_per_node, layout.onebit_node);
  const int64_t lo = std::max(first, int64_t(local) * m);
  const int64_t hi = std::min(first + numel, int64_t(local) * m + m);
  if (hi <= lo) return {true, worker_errors, 0, 0};
  return {true, worker_errors + (lo - int64_t(local) * m), hi - lo, lo - first};
}

void CarErrors::check_world(int32_t saved_world) {
  if (saved_world < 0 || saved_world == 1 || saved_world > kMaxWorld)
    fail(DSOPT_ECORRUPT, "state blob: invalid world size of the compression errors (" +
                             std::to_string(saved_world) + ")");
}

void CarErrors::describe(StateSchema& s, Kernels& kernels,
                         std::function<CompressedAllreduce*()> car, std::function<float*()> node_errors,
                         std::function<Layout()> live, std::function<bool(const BlobReader&)> restore_if,
                         StateSchema::Slicer slice, std::function<bool()> listed) const {
  const CarErrors self = *this;
  const auto length = [self, live](bool worker) {
    return [self, live, worker](const BlobReader* r) {
      const auto b = self.bytes(r ? self.saved_layout(*r) : live());
      return worker ? b.first : b.second;
    };
  };
  s.optional_record(
       prefix_ + ".topology", kTopologyBytes,
       [live](FieldWriter& f) {
         const Layout l = live();
         if (l.world > 1) f.add(l.ranks_per_node).add(l.nodes()).add(l.onebit_node ? kOneBitNodeRule : kSliceRule);
         else f.add(int32_t(0)).add(int32_t(0)).add(int32_t(0));
       },
       nullptr, nullptr, nullptr)
      .check([self, name = prefix_ + ".topology"](const BlobReader& r) {
        if (!r.has(name)) return;
        FieldReader f(r.section(name, kTopologyBytes), kTopologyBytes);
        const int32_t R = f.get<int32_t>(), N = f.get<int32_t>(), rule = f.get<int32_t>();
        const int32_t world = self.saved_world(r);
        const bool ok = world > 1 ? R >= 1 && N >= 1 && int64_t(R) * N == world &&
                                        (rule == kSliceRule || (rule == kOneBitNodeRule && N > 1 && R > 1))
                                  : R == 0 && N == 0 && rule == 0;
        if (!ok)
          fail(DSOPT_ECORRUPT, "state blob: invalid topology of the compression errors (" +
                                   std::to_string(N) + " nodes of " + std::to_string(R) +
                                   " ranks, rule " + std::to_string(rule) + ", world size " +
                                   std::to_string(world) + ")");
      });
  s.array(prefix_ + ".worker_error", kernels,
          [car]() -> void* { return car() ? car()->worker_error() : nullptr; }, length(true),
          restore_if)
      .view("worker_error", std::move(slice), std::move(listed))
      .array(prefix_ + ".server_error", kernels,
             [car]() -> void* { return car() ? car()->server_error() : nullptr; }, length(false),
             restore_if)
      .optional_array(
          prefix_ + ".node_error", kernels, [node_errors]() -> void* { return node_errors(); },
          [self, live](const BlobReader* r) { return self.node_bytes(r ? self.saved_layout(*r) : live()); },
          restore_if);
}

}  // namespace dsopt
