// What the 1-bit optimizers (1-bit Adam, 1-bit LAMB, 0/1 Adam) share as
// algorithms (optim/algorithm_impl.hpp): the compressed allreduce, flat or
// node-aware (docs/design/node-aware-allreduce.md), and its error buffers
// (rank-local state, docs/design/decisions.md K1/K2), the momentum masks, the
// warmup/compression stage of the optimizers that freeze the variance, the
// rule choices their blobs record (algorithms/onebit/rule_flag.hpp), and the state
// sections of all of these. Each optimizer adds its rule and its schedule,
// and lists its sections in its own order (the blob layout).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "comm/node_aware_allreduce.hpp"
#include "algorithms/onebit/car_errors.hpp"
#include "algorithms/onebit/freeze_stage.hpp"
#include "algorithms/onebit/momentum_masks.hpp"
#include "algorithms/onebit/onebit_settings.hpp"
#include "algorithms/onebit/stage_record.hpp"
#include "optim/algorithm_impl.hpp"

namespace dsopt {

class OneBitOptimizer : public AlgorithmImpl {
 public:
  // Keeps a copy of parameter i's mask (algorithms/onebit/momentum_masks.hpp).
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask) override;
  // Collective: takes the node and rail communicators where the
  // compressed allreduce runs node-aware (OptimizerParts::node_comms), and
  // starts the allreduce of an algorithm that compresses from the start.
  void created() override;
  // Whether loading blob `r` drops compression errors it holds (another
  // world size or topology): dsopt_state_load_ex reports the reset.
  bool drops_rank_local(const BlobReader& r) const override;

 protected:
  // The names of the shared state sections, and what they hold.
  struct Sections {
    const char* errors;  // <errors>.worker_error and <errors>.server_error
    const char* stage;   // the stage record (nullptr: none)
    bool stage_holds_frozen_after;  // see StageRecord::bytes
    const char* rule;    // the bias-correction flag (nullptr: none)
    const char* units;   // the compression-units flag
    // The rank-local state the errors are part of, in dsopt_state_load's
    // messages.
    const char* rank_local;
    // Where a blob records the world size of the errors; nullptr: in the
    // stage record.
    CarErrors::WorldReader saved_world;
  };

  OneBitOptimizer(OptimizerParts& parts, Sections sections);

  std::string rank_local_state(const BlobReader& r) const override {
    return errors_.rank_local_state(r);
  }

  // ---- what the compressed allreduce runs over (call once, from the
  // constructor) ----
  // The parameters `indices`, one tensor each, in this order.
  void compress_params(const std::vector<int64_t>& indices);
  // One tensor of every parameter back to back, padded to `padded`
  // elements (the errors hold the parameters at their offsets).
  void compress_fused(int64_t padded);
  // Whether the compressed allreduce runs from creation on (0/1 Adam);
  // else it starts with the compression stage. Call from the constructor.
  void compress_from_start() { from_start_ = true; }
  // Starts the compressed allreduce where it has ranks and tensors to run
  // over: node-aware where created() got node and rail communicators, else
  // flat. Collective only through what it runs later.
  void start_compressed_allreduce();
  // Whether the compressed allreduce is running (not before it starts, at
  // one rank, or with nothing to compress).
  bool has_car() const { return car_ || node_car_; }
  // The world size to record with its errors: the communicator's while
  // it runs, else 0.
  int32_t car_world() const { return has_car() ? int32_t(parts_.comm().size()) : 0; }
  // Averages `tensors` (one per tensor of the compressed allreduce) through
  // it; nothing without one. Collective.
  void run_compressed(std::vector<float*> tensors);
  // The same for operand `operand` of `slots`, one per tensor.
  void run_compressed(const std::vector<UpdateSlot>& slots, Operand operand);
  void reset_compression_errors() {
    if (node_car_) node_car_->reset_errors();
    else if (CompressedAllreduce* c = error_car()) c->reset_errors();
  }

  std::vector<const float*> mask_pointers() const { return masks_.pointers(); }

  // The config's 1-bit settings (onebit_settings.hpp).
  const OneBitSettings& settings() const { return parts_.config().settings_as<OneBitSettings>(); }

  // ---- the rule choices ----
  bool bias_correction() const { return bias_correction_; }
  // Whether the compressed values are in the update's units now (the
  // stabilized rule, with a compressed allreduce).
  bool compresses_update_units() const { return update_units_ && has_car(); }
  bool update_units() const { return update_units_; }

  // ---- the warmup/compression stage (algorithms/onebit/freeze_stage.hpp) ----
  const FreezeStage& stage() const { return stage_; }
  // After a warmup update: enters the compression stage when it is due.
  void freeze_if_due();
  // Enters the compression stage with v frozen after `warmup_updates`.
  void enter_compression(int64_t warmup_updates);
  // What the algorithm freezes with v when the compression stage starts.
  virtual void freeze_state() {}
  // The stabilized rule's momentum limit of group g in the compression stage.
  float frozen_momentum_limit(int32_t g) const {
    return settings().momentum_limit(parts_.group(g).beta2, stage_.frozen_after);
  }
  // divergence_hint() of a compression stage, with `lr` the step-size knobs.
  std::string stage_divergence_hint(const std::string& lr) const;

  // ---- state sections ----
  // The stage record, saved from the current stage.
  StateSchema& describe_stage(StateSchema& s);
  // The stage record of (checked) blob `r`.
  StageRecord saved_stage(const BlobReader& r) const {
    return StageRecord::read(r, sections_.stage, sections_.stage_holds_frozen_after);
  }
  // Continues in the stage of a loaded `record` (StageRecord::resumed):
  // compressing as it was, else entering compression now when freeze_step
  // changed and it is due.
  void resume_stage(const StageRecord& record);
  // The rule flags: bias correction (where named), then compression units.
  StateSchema& describe_rules(StateSchema& s);
  // Whether blob `r` recorded its rank-local state at this run's world
  // size (rank_local_world) and topology.
  bool same_world(const BlobReader& r) const;
  // The error sections (CarErrors::describe), restored where `restore_if`
  // (nullptr: into a compressed allreduce at the blob's world size).
  void describe_errors(StateSchema& s, std::function<bool(const BlobReader&)> restore_if = nullptr);

 private:
  Sections sections_;
  FreezeStage stage_;
  MomentumMasks masks_;
  CarErrors errors_;
  std::vector<int64_t> car_sizes_;  // the compressed allreduce's tensors
  // Per parameter, its tensor in the compressed allreduce (-1: none); empty
  // where one fused tensor holds every parameter.
  std::vector<int64_t> tensor_of_;
  // The layout of the errors here (world size 0 where nothing is
  // compressed across ranks).
  CarErrors::Layout layout() const;
  // layout() with the world size of the errors that exist now (car_world).
  CarErrors::Layout live_layout() const;
  // The flat allreduce whose errors are this rank's: car_, or the rail
  // allreduce of node_car_; nullptr while neither runs.
  CompressedAllreduce* error_car() const {
    return car_ ? car_.get() : node_car_ ? &node_car_->rail_allreduce() : nullptr;
  }
  // Before a node-aware run: the communicator's upkeep reaches the node
  // and rail communicators (prepare, timeout, another optimizer's pending
  // work on them).
  void tend_node_comms();
  std::unique_ptr<CompressedAllreduce> car_;
  std::unique_ptr<NodeAwareAllreduce> node_car_;
  NodeComms* node_comms_ = nullptr;  // OptimizerParts' (created)
  bool from_start_ = false;
  // The config's choices, or a loaded blob's.
  bool bias_correction_;
  bool update_units_;
};

}  // namespace dsopt
