// Moment state (the moment rules: Adam/AdamW, LAMB, Lion, SGD) as pieces of parameters, whatever layout saved it
// (docs/design/zero.md section 11.6): a stage-0 blob holds every parameter's
// moments (and the fp32 masters of 16-bit parameters); a ZeRO blob holds
// its shard of them, described by its zero.layout section. Resharding
// copies, for each piece of the new layout, the intersecting pieces of the
// old blobs, by interval intersection in parameter order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "params/param_set.hpp"
#include "state/blob.hpp"
#include "state/section_names.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

// Blob section names of ZeRO (the moments' are the algorithm's
// MomentNames, state/section_names.hpp).
constexpr const char* kZeroLayoutSection = "zero.layout";
constexpr const char* kZeroMastersSection = "zero.masters";
constexpr const char* kZeroFeedbackSection = "zero.feedback";  // a rank's gradient residual
// 1: zero.feedback holds int8 runs (GradientReducer::residual_bytes); blobs
// without it hold n' fp32 values.
constexpr const char* kZeroFeedbackInt8Section = "zero.feedback_int8";
constexpr const char* kZeroFeedbackScaleSection = "zero.feedback_scale";  // the loss scale it is in
// The topology the residual belongs to: uint32 N, uint32 R (node-aware
// ZeRO, docs/design/node-aware-zero.md); blobs without it hold the flat
// form's residual (N = P, R = 1).
constexpr const char* kZeroFeedbackTopologySection = "zero.feedback_topology";
constexpr uint64_t kZeroLayoutBytes = 4 + 4 + 4 + 8 + 8 + 8;

// What a ZeRO blob records about its layout.
struct ZeroLayoutRecord {
  int32_t stage;
  uint32_t world, rank;
  int64_t bucket_elems;   // B of the layout
  int64_t shard_numel;    // S
  int64_t master_numel;   // fp32 masters kept (16-bit parameters' elements in the shard)
};
std::vector<uint8_t> encode(const ZeroLayoutRecord& r);
// Throws Error(DSOPT_ECORRUPT) when the section is malformed.
ZeroLayoutRecord decode_zero_layout(const BlobReader& r);

// A run of one parameter's state: numel elements from param_offset on.
struct StatePiece {
  int64_t param, param_offset, numel;
  int64_t state_offset;   // in the moment arrays
  int64_t master_offset;  // in the master array; -1 for fp32 parameters (no master)
};

// The pieces a rank's state arrays hold, with their lengths.
struct StateLayout {
  std::vector<StatePiece> pieces;
  int64_t state_numel = 0;
  int64_t master_numel = 0;
};
// Stage 0: every parameter whole, moments in parameter order, masters of
// the 16-bit parameters back to back.
StateLayout replicated_state_layout(const std::vector<BlobParam>& params);
// ZeRO: rank's fragments; masters of its 16-bit fragments back to back,
// or, with `all_masters` (a compressed parameter allgather), masters of
// every element in shard order (master_offset = state_offset, S of them).
StateLayout sharded_state_layout(const ShardLayout& layout, int rank,
                                 const std::vector<BlobParam>& params, bool all_masters = false);

// Host copies of resharded state, laid out as a StateLayout says (v empty
// for a rule with one moment).
struct HostMomentState {
  std::vector<float> m, v, masters;
  // fp32 values of the target's fp32 pieces without a master that a
  // source kept a master of (a run with a compressed parameter allgather):
  // the parameter's true values, to write into its buffer.
  struct ParamValues {
    int64_t param, param_offset;
    std::vector<float> values;
  };
  std::vector<ParamValues> fp32_params;
};
// Reads n fp32 values of parameter `param` from element `offset` on (the
// caller's buffer), for target masters whose source kept none.
using ReadParam = std::function<void(int64_t param, int64_t offset, int64_t n, float* out)>;

// Validates that `blobs` (already checked to be one save of one run, in
// rank order) hold the moments `moments` names, all stage 0 or one
// complete set of ZeRO shards, and assembles `target` from them. Throws,
// changing nothing, otherwise.
HostMomentState assemble_moment_state(const std::vector<std::shared_ptr<const BlobReader>>& blobs,
                                  const std::vector<BlobParam>& params, const StateLayout& target,
                                  const MomentNames& moments, const ReadParam& read_param = nullptr);

// Writes state.fp32_params into the caller's fp32 parameters.
void write_param_values(const HostMomentState& state, const ParamSet& params, Kernels& kernels);

}  // namespace dsopt
