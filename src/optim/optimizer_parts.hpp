// The parts of an optimizer, each with one job, built from its config: the
// parameters and masters (params/param_set.hpp), the kernels of its device
// and of the host, dsopt's thread for bucket reductions and gathers, how
// collective calls settle across ranks, the step pipeline, the
// hyperparameter groups and step counters (optim/hyper_groups.hpp), absent
// gradients, the divergence check, the state blob (optim/state_io.hpp) and
// ZeRO's deferred parameter allgather (optim/deferred_gathers.hpp).
//
// The facade (facade/optimizer.hpp) owns them and its algorithm
// (optim/algorithm_impl.hpp), which is given them at construction and
// reads what it needs of them; the few things every algorithm's code asks
// of several parts at once are here too (flat_slices, restore_common, ...).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "comm/rank_agreement.hpp"
#include "comm/topology.hpp"
#include "kernels/kernels.hpp"
#include "optim/absent_grads.hpp"
#include "optim/config.hpp"
#include "optim/deferred_gathers.hpp"
#include "optim/divergence_check.hpp"
#include "optim/hyper_groups.hpp"
#include "optim/shard_group.hpp"
#include "optim/state_io.hpp"
#include "optim/step_pipeline.hpp"
#include "params/param_set.hpp"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class OptimizerParts {
 public:
  // `blob_name` and `describe` are the algorithm's name in blobs and its
  // state list (StateIO); `mark_failed(status, what)` records a failed
  // deferred gather as the optimizer's failure. Throws Error(DSOPT_EINVAL)
  // on bad parameter descriptors.
  OptimizerParts(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
                 const dsopt_tensor* params, int64_t count, std::function<std::string()> blob_name,
                 std::function<void(StateSchema&)> describe,
                 std::function<void(int, const std::string&)> mark_failed);
  ~OptimizerParts() { stop_reductions(); }
  OptimizerParts(const OptimizerParts&) = delete;
  OptimizerParts& operator=(const OptimizerParts&) = delete;

  const OptimizerConfig& config() const { return cfg_; }
  Comm& comm() const { return comm_; }
  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  Kernels& kernels() const { return *kernels_; }
  // The CPU kernels of the optimizer's host work (CPU offload, or the
  // kernels themselves on the CPU).
  Kernels& host_kernels() const { return *host_; }
  const Mem mem() const { return Mem{kernels_.get(), cfg_.cuda_aware}; }
  // Where the bucket reductions and deferred gathers run.
  CommRunner& runner() { return runner_; }
  // How the optimizer's collective calls settle across ranks.
  RankAgreement& agreement() { return agreement_; }
  // The ranks holding the other shards of the parameters
  // (dsopt_comm_set_shards; inactive without).
  const ShardGroup& shards() const { return shards_; }
  StepPipeline& pipeline() { return pipeline_; }
  const StepPipeline& pipeline() const { return pipeline_; }
  HyperGroups& groups() { return groups_; }
  const HyperGroups& groups() const { return groups_; }
  int32_t num_groups() const { return groups_.num_groups(); }
  int64_t group_step(int32_t g) const { return groups_.group_step(g); }
  const AdamHyper& group(int32_t g) const { return groups_.group(g); }
  double loss_scale() const { return pipeline_.scaler().scale(); }
  AbsentGrads& absent() { return absent_; }
  const AbsentGrads& absent() const { return absent_; }
  DivergenceCheck& divergence() { return divergence_; }
  const StateIO& io() const { return io_; }
  // From an update: DeferredGathers::defer_gathers.
  DeferredGathers& gathers() { return gathers_; }
  const DeferredGathers& gathers() const { return gathers_; }
  // The identifier of the run, the same on every rank (blobs carry it).
  void set_run_id(uint64_t id) { run_id_ = id; }

  // ---- nodes (docs/guides/multi-node.md) ----
  // Collective, once at creation: where the ranks sit, declared by the
  // config's topology.ranks_per_node or found from the communicator, which
  // then counts the bytes it sends to other nodes by it (Comm::set_nodes).
  // Throws Error(DSOPT_EINVAL) when the declared nodes do not divide the
  // world.
  void find_topology();
  const Topology& topology() const { return topology_; }
  // Whether the compressed collectives run node-aware: the config's
  // topology.hierarchy; "auto" where the ranks span several nodes of more
  // than one rank each.
  bool node_aware() const;
  // The node and rail communicators of the topology (collective on first
  // use: call it from AlgorithmImpl::created); nullptr where !node_aware()
  // or, under "auto", where the communicator cannot be split (a custom
  // communicator: flat_reason() says so). Throws what Comm::split throws
  // under "node_aware".
  NodeComms* node_comms();
  // Why the compressed collectives run flat on a topology of several nodes
  // ("" where they do not, or it is the config's choice).
  const std::string& flat_reason() const { return flat_reason_; }

  // Views of arrays laid out like the parameters back to back (parameter i
  // at Param::offset).
  StateSchema::Slicer flat_slices() const;
  // The world size a blob recorded with its rank-local state, as the
  // state's restore compares it with this run's: `saved_world`, or 0 while
  // a load resets rank-local state (DSOPT_LOAD_RESET_RANK_LOCAL), which then
  // starts over as after a load at another world size.
  int32_t rank_local_world(int32_t saved_world) const {
    return resetting_rank_local_ ? 0 : saved_world;
  }
  // Set by the facade around the restore of a load that resets.
  void set_resetting_rank_local(bool on) { resetting_rank_local_ = on; }
  // Restores steps, learning rates, the loss scaler and the run id (what
  // every blob shares); for resharding restores.
  void restore_common(const BlobReader& r) { io_.restore_common(r); }
  // Sets the fp32 masters of the 16-bit parameters (host values, parameter
  // order) and rounds them into the caller's parameters.
  void restore_masters(const float* host);
  // Waits for the deferred gathers and stops the runner; an algorithm
  // whose buffers reductions use calls it first in its destructor.
  void stop_reductions() {
    gathers_.wait_gathers_quietly();
    runner_.stop();
  }

 private:
  OptimizerConfig cfg_;
  Comm& comm_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<Kernels> host_;
  ShardGroup shards_;
  ParamSet params_;
  CommRunner runner_;
  RankAgreement agreement_;
  StepPipeline pipeline_;
  HyperGroups groups_;
  AbsentGrads absent_;
  DivergenceCheck divergence_;
  uint64_t run_id_ = 0;
  StateIO io_;
  DeferredGathers gathers_;
  bool resetting_rank_local_ = false;  // see rank_local_world()
  Topology topology_;
  std::unique_ptr<NodeComms> node_comms_;
  bool node_comms_tried_ = false;
  std::string flat_reason_;
};

}  // namespace dsopt
