// ZeRO stage 1 and 2 (docs/guides/zero.md) with a moment rule
// (algorithms/moment_rules/moment_rule.hpp: Adam, AdamW, LAMB): this rank keeps the moments,
// and fp32 masters of 16-bit parameters, for its shard only; gradients are reduce-scattered into the
// shard, the update runs on it, and the parameters are allgathered back
// into the caller's buffers. The caller passes all its gradients to
// dsopt_step, so both stages hold the same buffers here; they differ once
// gradients are handed over during backward. LAMB's trust ratios take the
// norms of whole tensors across the shards (zero/shard_tensor_sums.hpp).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "algorithms/moment_rules/moment_rule.hpp"
#include "optim/moments.hpp"
#include "optim/algorithm_impl.hpp"
#include "zero/moment_shards.hpp"
#include "algorithms/moment_rules/offloaded_update.hpp"
#include "zero/gradient_reducer.hpp"
#include "zero/param_gatherer.hpp"
#include "zero/shard_layout.hpp"
#include "zero/shard_tensor_sums.hpp"

namespace dsopt {

class ZeroOptimizer final : public AlgorithmImpl {
 public:
  explicit ZeroOptimizer(OptimizerParts& parts);
  ~ZeroOptimizer() override { parts_.stop_reductions(); }
  // With a parameter codec: every rank's buffers take the decoded values of
  // the owners' masters, as after every step.
  // Node-aware (docs/design/node-aware-zero.md): the codes take the node
  // and rail communicators where the topology has R > 1.
  void created() override;
  bool drops_rank_local(const BlobReader& r) const override;

 protected:
  std::string blob_name() const override { return moment_algorithm(parts_.config()); }
  PreparedGrads prepare(const dsopt_tensor* grads, int64_t count) override;
  GradientHandover& handover() override { return reducer_; }
  void open_handover(int micro_batches) override;
  PreparedGrads prepare_handed_over() override;
  UpdateOutcome update(const PreparedGrads& grads) override;
  bool skips_absent() const override { return rule_ != MomentRule::Lamb; }
  int64_t num_gather_chunks() const override { return gatherer_.chunks(); }
  std::vector<int64_t> gather_chunks_of(int64_t param_index) const override {
    return gatherer_.chunks_of(param_index);
  }
  void describe_state(StateSchema& s) override;
  std::function<void()> reshard(const Blobs& blobs) override;

 private:
  ZeroOptimizer(OptimizerParts& parts, const OptimizerConfig& cfg, Comm& comm);
  ZeroLayoutRecord record() const;
  // The topology (N, R) blob r's residual belongs to: its
  // zero.feedback_topology record, else the flat one of its world size.
  std::pair<uint32_t, uint32_t> saved_residual_topology(const BlobReader& r) const;
  // Whether blob r's residual is restored: saved as int8 runs under this
  // run's topology, and the load does not reset rank-local state.
  bool residual_fits(const BlobReader& r) const;
  // Throws Error(DSOPT_EMISMATCH) unless blob r is this rank's shard of a
  // run with this layout.
  void check_layout(const BlobReader& r) const;
  // Parameter i's run in this rank's shard of the moments or the masters
  // (found with no data when the rank holds none of it).
  StateSchema::Slice shard_slice(int64_t i, float* array, bool masters) const;
  // The step's status and multipliers from what the reduction found.
  PreparedGrads prepared(const ReducedShard& reduced);
  // Rounds the masters of this rank's 16-bit fragments into the caller's
  // buffers and gathers every rank's; after a load.
  void publish_parameters();
  // The update slots, one per fragment (not with offload), pointed at the
  // caller's buffers again when the parameters were rebound since.
  const std::vector<UpdateSlot>& slots();
  void point_slots();

  // Where masters and moments live: the host with CPU offload.
  Kernels& state_kernels() const { return offload_ ? parts_.host_kernels() : parts_.kernels(); }

  MomentRule rule_;
  bool offload_;
  ShardLayout layout_;
  bool compressed_params_;  // a parameter codec at 2+ ranks: masters of every element
  StateLayout state_;         // this rank's fragments, with master offsets
  DeviceBuffer masters_;      // fp32 masters of the shard's 16-bit elements
  Moments moments_;           // over the shard (S elements)
  DeviceBuffer scratch_;      // the reducer's bucket, then the gatherer's chunk
  GradientReducer reducer_;
  ParamGatherer gatherer_;
  DeviceBuffer u_;             // LAMB's direction over the shard
  std::unique_ptr<ShardTensorSums> sums_;  // LAMB's norms of whole tensors
  std::vector<UpdateSlot> slots_;  // see slots()
  uint64_t slots_generation_ = 0;  // parts_.params().generation() slots_ point at
  std::unique_ptr<OffloadedUpdate> offloaded_;  // with offload; unpins before the buffers go
};

}  // namespace dsopt
