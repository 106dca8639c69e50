// The interface every algorithm implements, and the step and load
// orchestration they share: the call handshake, the gradient hand-over,
// absent gradients, the replication check, what a step reports and how a
// failed one leaves the optimizer. The parts it owns have one job each:
// the parameters and masters (params/param_set.hpp), the step pipeline,
// the hyperparameter groups and step counters (optim/hyper_groups.hpp), the
// state blob (optim/state_io.hpp) and ZeRO's deferred parameter allgather
// (optim/deferred_gathers.hpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "handover/gradient_handover.hpp"
#include "kernels/kernels.hpp"
#include "optim/absent_grads.hpp"
#include "optim/adam_step_consts.hpp"
#include "optim/call_handshake.hpp"
#include "optim/config.hpp"
#include "optim/deferred_gathers.hpp"
#include "optim/divergence_check.hpp"
#include "optim/hyper_groups.hpp"
#include "optim/lamb_step.hpp"
#include "optim/moment_rule.hpp"
#include "optim/replication_check.hpp"
#include "optim/state_io.hpp"
#include "optim/step_pipeline.hpp"
#include "params/param_set.hpp"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

struct StepResult {
  bool skipped = false;
  bool compressed = false;
  int64_t step = 0;
  double loss_scale = 1.0;
  double grad_norm = -1.0;
  int64_t consecutive_skips = 0;  // skipped steps in a row, this one included
  int32_t phase = DSOPT_PHASE_SKIPPED;  // what the step did (DSOPT_PHASE_*)
  bool grads_replicated = false;  // a checked step's gradients were equal on every rank
  bool diverging = false;  // in a divergence episode (optim/divergence_check.hpp)
  uint64_t bytes_sent = 0;  // by this rank through the communicator for this step
  // Non-empty when the run is not progressing (docs/design/decisions.md S2):
  // dsopt_step then returns DSOPT_ENONFINITE with this message.
  std::string alarm;
};

class Optimizer {
 public:
  Optimizer(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
            const dsopt_tensor* params, int64_t count);
  virtual ~Optimizer();

  // Collective. grads == nullptr with count 0 completes a step whose
  // gradients were handed over with grad_ready.
  StepResult step(const dsopt_tensor* grads, int64_t count);
  // New storage for every parameter (dsopt_rebind_params): throws
  // Error(DSOPT_EINVAL), changing nothing, on bad descriptors or while
  // gradients are being handed over. Not collective.
  void rebind_params(const dsopt_tensor* params, int64_t count);
  // Takes one parameter's gradient of one micro-batch (dsopt_grad_ready);
  // the first of a step starts the handshake. Throws Error(DSOPT_EINVAL),
  // changing nothing, on bad arguments.
  void grad_ready(int64_t param_index, const dsopt_tensor* grad);
  // Whether gradients of the coming step are being handed over.
  bool handing_over() { return handover().is_open(); }

  // The hyperparameter groups: learning rates and the other group
  // hyperparameters by name (dsopt_set_lr, dsopt_get/set_group_param).
  HyperGroups& groups() { return groups_; }
  const HyperGroups& groups() const { return groups_; }
  double loss_scale() const { return pipeline_.scaler().scale(); }
  double gradient_clipping() const { return pipeline_.config().gradient_clipping; }
  // Throws Error(DSOPT_EINVAL), changing nothing, while gradients are being
  // handed over (the step in progress decides on the norm's collectives).
  void set_gradient_clipping(double max_norm);

  // Updates applied to parameter i (dsopt_get_param_step); set_param_step
  // throws Error(DSOPT_EUNSUPPORTED) where steps follow the stages.
  int64_t param_step(int64_t param_index) const;
  // numel and group of parameter i (throws Error(DSOPT_EINVAL) when out of range).
  int64_t param_numel(int64_t param_index, int32_t* group) const;
  void set_param_step(int64_t param_index, int64_t step);

  // Part of one parameter's state in dsopt's memory (dsopt_get_state_view).
  struct StateView {
    float* data = nullptr;  // nullptr when this rank holds none of it
    int64_t numel = 0;
    int64_t offset = 0;     // first element of the parameter held
    bool on_device = false; // CUDA memory
  };
  // Throws Error(DSOPT_EINVAL) naming state_names() for an unknown name or
  // one this parameter does not have.
  StateView state_view(int64_t param_index, const std::string& name);
  // The names state_view accepts, separated by single spaces.
  const std::string& state_names() const;

  // Throws Error with the failing step's status, saying the state is
  // inconsistent and how to recover, once a step failed after it had begun
  // to change the state (a collective of its update failed: the parameters
  // and the state may then differ from every consistent point, on this rank
  // and between ranks); `call` names the entry point in the message. Calls
  // that would use or save the state check it.
  void require_intact(const char* call) const;

  // Measures (dst null) or writes the state blob; returns its size.
  uint64_t save(void* dst, uint64_t capacity) const { return io_.save(dst, capacity); }
  // Validates the whole blob, then restores it. Collective. `flags`:
  // DSOPT_LOAD_RESET_RANK_LOCAL or 0. Returns whether rank-local state was
  // reset because some rank's blob was saved by another rank.
  bool load(const void* src, uint64_t size, uint32_t flags = 0);
  // Validates every blob of a saved run (all ranks' blobs in rank order, or
  // one replica of replicated state), then restores this rank's state from
  // them: resharded where the algorithm supports it, else the blob of this
  // rank (same world size) or the first one. Collective.
  void load_shards(const void* const* blobs, const uint64_t* sizes, int64_t count);

  // Collective, once every rank has built its optimizer and the ranks
  // agree (dsopt_create): what creation needs the other ranks for.
  virtual void created() {}
  // The identifier of this run, the same on every rank; blobs carry it so
  // that blobs of different runs are not mixed. Set after creation.
  void set_run_id(uint64_t id) { run_id_ = id; }
  // The CPU threads of this optimizer's host work (its kernels, on the
  // CPU), and the default given at create to a config without "threads".
  int threads() const { return host_->threads(); }
  void set_default_threads(int threads);
  // A hash of samples of the parameters' current values.
  uint64_t params_fingerprint() const { return params_.fingerprint(); }

  // Bytes of the buffers dsopt holds for this optimizer, in host and in
  // device memory (the caller's parameters are not counted).
  struct MemoryUsage {
    uint64_t host = 0, device = 0;
  };
  MemoryUsage memory_usage() const;
  // The part of them that is state the blob saves (the state schema's
  // arrays); the rest are gradient, scratch and communication buffers.
  MemoryUsage state_memory_usage() const;

  // The momentum mask of a parameter (1-bit optimizers); nullptr clears it.
  // Throws Error(DSOPT_EUNSUPPORTED) where the algorithm has none.
  virtual void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask);

  Comm& comm() const { return comm_; }

  // The deferred parameter allgather of ZeRO (optim/deferred_gathers.hpp),
  // in gather order (optim/gather_order.hpp: the shard layout's, or the
  // one set_gather_order gave). gather_buckets() is the number of buckets
  // (0 when parameters are never gathered: stage 0, one rank),
  // gather_bucket_of(i) the position in gather order after which parameter
  // i is whole (-1: always whole).
  int64_t gather_buckets() const { return num_gather_chunks(); }
  int64_t gather_bucket_of(int64_t param_index) const;
  // Collective (dsopt_gather_order): the order in which the caller needs
  // the parameters, a permutation of their indices (count 0: the default
  // order), from the next step on. Throws, changing nothing on any rank:
  // Error(DSOPT_EINVAL) on a rank whose order is not a permutation
  // (DSOPT_EMISMATCH on the others), Error(DSOPT_EMISMATCH) on every rank
  // when the ranks' orders differ.
  void set_gather_order(const int64_t* order, int64_t count);
  // Waiting for the buckets in flight (a failed gather marks the optimizer
  // failed: require_intact).
  DeferredGathers& gathers() { return gathers_; }

 protected:
  // The algorithm's name in blobs ("AdamW", "Adam", ...).
  virtual std::string algorithm() const = 0;
  // Whether parameter i's gradient is averaged over ranks in the coming step
  // (else it stays this rank's own).
  virtual bool averaged(int64_t param_index) const { (void)param_index; return true; }
  // Checks, averages, unscales and clips the gradients (the step pipeline);
  // ZeRO reduce-scatters them into its shard instead. Collective.
  virtual PreparedGrads prepare(const dsopt_tensor* grads, int64_t count);
  // The same for gradients handed over one by one: where they go, opening
  // a window of G micro-batches, and (collective, after the window's
  // reductions have finished) the prepared gradients.
  virtual GradientHandover& handover() { return pipeline_.handover(); }
  virtual void open_handover(int micro_batches);
  virtual PreparedGrads prepare_handed_over() {
    return pipeline_.prepare_handed_over(update_sums());
  }
  // Whether update() sums the squares of the gradients it reads when
  // PreparedGrads::norm_by_update asks it to (update_moments does, but for
  // LAMB), returning the sum (UpdateOutcome::grad_sumsq).
  virtual bool update_sums() const { return false; }
  // Where the bucket reductions run; and stopping it, which a subclass
  // whose buffers reductions use calls first in its destructor.
  CommRunner& runner() { return runner_; }
  void stop_reductions() {
    gathers_.wait_gathers_quietly();
    runner_.stop();
  }
  // The parameter allgather as buckets (chunks) for gather_buckets(), and
  // the chunks that write parameter i (ascending; none: never gathered);
  // an algorithm that gathers overrides both.
  virtual int64_t num_gather_chunks() const { return 0; }
  virtual std::vector<int64_t> gather_chunks_of(int64_t param_index) const {
    (void)param_index;
    return {};
  }
  // From update(): defers the gather of every chunk c (run(c)), in gather order,
  // where it may, and returns true; else returns false (the caller gathers
  // at once). See DeferredGathers::defer_gathers.
  bool defer_gathers(int64_t chunks, uint64_t bytes, const std::function<void(int64_t)>& run) {
    return gathers_.defer_gathers(chunks, bytes, run);
  }
  // Applies one update with prepared gradients; step counters are already
  // incremented. Returns whether the step used compressed communication,
  // and the gradients' sum of squares where grads.norm_by_update asks.
  virtual UpdateOutcome update(const PreparedGrads& grads) = 0;
  // The DSOPT_PHASE_* of an applied step whose update() returned `compressed`.
  virtual int32_t step_phase(bool compressed) const {
    return compressed ? DSOPT_PHASE_COMPRESSED : DSOPT_PHASE_FULL;
  }
  // What to try when steps keep being skipped (the DSOPT_ENONFINITE message).
  virtual std::string divergence_hint() const {
    return "try a lower lr or \"gradient_clipping\"";
  }
  // The algorithm's own state, section by section (state/state_schema.hpp):
  // saved, checked (throw, change nothing), restored and shown as state
  // views from this list. The entries restore into this object; describing
  // them changes nothing. ("master" of a 16-bit parameter is the base
  // class's view unless the list has one.)
  virtual void describe_state(StateSchema& s) = 0;
  // Views of arrays laid out like the parameters back to back (parameter i
  // at Param::offset).
  StateSchema::Slicer flat_slices() const;
  // What of a (checked) blob's state belongs to the rank that saved it, in
  // words for messages ("" when nothing): restored only by that rank at the
  // same world size, reset elsewhere (rank_local_world).
  virtual std::string rank_local_state(const BlobReader& r) const {
    (void)r;
    return "";
  }
  // The world size a blob recorded with its rank-local state, as
  // the state's restore compares it with this run's: `saved_world`, or 0 while
  // a load resets rank-local state (DSOPT_LOAD_RESET_RANK_LOCAL), which then
  // starts over as after a load at another world size.
  int32_t rank_local_world(int32_t saved_world) const {
    return resetting_rank_local_ ? 0 : saved_world;
  }
  // Resharding for load_shards: validates `blobs` (a checked set, see
  // StateIO::read_set) and returns what restores this rank's state from them, or
  // nullptr when the algorithm does not reshard (load_shards then restores
  // one blob). Throws, changing nothing, when they cannot be loaded.
  using Blobs = StateIO::Blobs;
  virtual std::function<void()> reshard(const Blobs& blobs) {
    (void)blobs;
    return nullptr;
  }
  // Whether a parameter whose gradient is absent on every rank is left
  // alone, state and step count included (Adam/AdamW), rather than stepped
  // with a zero gradient (the 1-bit optimizers; see dsopt_step).
  virtual bool skips_absent() const { return false; }
  // This step's Adam constants: per group, or per parameter when steps
  // differ or parameters are left out (call from update()).
  AdamStepConsts adam_step_consts() const { return groups_.adam_step_consts(absent_.inactive()); }
  // This step's LAMB constants, per parameter (math/onebit_lamb.hpp), at
  // the parameter's own update count; bias-corrected as its group says.
  LambStepConsts lamb_step_consts() const { return groups_.lamb_step_consts(); }
  // One update of a moment rule (optim/moment_rule.hpp) over `slots`: whole
  // tensors or a shard's fragments, param_of(k) the parameter of slot k,
  // whose group is its parameter's group; LAMB's slots carry the U stream
  // and `sums` gives it the per-tensor sums of squares (lamb_step.hpp).
  // Returns the gradients' sum of squares where grads.norm_by_update asks
  // (0 otherwise).
  double update_moments(MomentRule rule, const std::vector<UpdateSlot>& slots,
                      const std::function<int64_t(size_t)>& param_of, const PreparedGrads& grads,
                      const TensorSums& sums);
  // Restores steps, learning rates, the loss scaler and the run id (what
  // every blob shares); for reshard's restore functions.
  void restore_common(const BlobReader& r) { io_.restore_common(r); }
  // Sets the fp32 masters of the 16-bit parameters (host values, parameter
  // order) and rounds them into the caller's parameters.
  void restore_masters(const float* host);

  const ParamSet& params() const { return params_; }
  Kernels& kernels() const { return *kernels_; }
  int32_t num_groups() const { return groups_.num_groups(); }
  int64_t group_step(int32_t g) const { return groups_.group_step(g); }
  const AdamHyper& group(int32_t g) const { return groups_.group(g); }
  const OptimizerConfig& config() const { return cfg_; }
  const Mem mem() const { return Mem{kernels_.get(), cfg_.cuda_aware}; }
  StepPipeline& pipeline() { return pipeline_; }
  // How this optimizer's collective calls settle across ranks.
  RankAgreement& agreement() { return agreement_; }
  Kernels& host_kernels() const { return *host_; }

 private:
  std::string alarm(bool stuck_at_min_scale, double scale_used) const;
  // Records that the update in progress failed (require_intact).
  void mark_failed(int status, const std::string& what);
  using Call = CallHandshake::Call;
  // Enters a collective call (optim/call_handshake.hpp); `absent` counts
  // only where the algorithm skips absent gradients.
  bool enter_collective(Call call, bool absent = false, bool* someone_abandons = nullptr) {
    return handshake_.enter(call, absent && skips_absent(), someone_abandons);
  }
  // Runs `validate` (which returns the restore, and sets its argument when
  // the restore resets rank-local state), agrees across ranks that every
  // rank validated and whether any resets, then restores (resetting on every
  // rank when any does); on any failure nothing changes. Returns whether it
  // reset.
  bool load_collectively(const std::string& call,
                         const std::function<std::function<void()>(bool& reset)>& validate);
  // Whether checked blob `r` holds rank-local state that another rank of
  // this world size saved. Unless `may_reset`, throws Error(DSOPT_EMISMATCH)
  // saying what to load instead.
  bool others_rank_local(const BlobReader& r, bool may_reset) const;
  // Whether the coming step's gradients are compared across ranks
  // (ReplicationCheck::applies).
  bool checks_replication() const {
    return ReplicationCheck::applies(comm_.size(), groups_.group_step(0));
  }
  // The step's grads_replicated (ReplicationCheck::check_step) where it is
  // checked, else false.
  bool check_replication(const dsopt_tensor* grads, int64_t count) {
    return checks_replication() && replication_.check_step(params_, grads, count, agreement_);
  }
  // step() but for the bytes sent.
  StepResult step_uncounted(const dsopt_tensor* grads, int64_t count);
  // Completes a step whose gradients were handed over; `abandon`: this
  // rank's are unusable, and every rank fails the step (DSOPT_EINVAL,
  // nothing changed) once the window's reductions have completed.
  StepResult step_handed_over(bool abandon);
  // The masters and the algorithm's state list, described on first use.
  const StateSchema& state_schema() const { return io_.state(); }
  // Opens a step's hand-over window (and posts its handshake).
  void open_window();
  // averaged(i) of every parameter, for the step pipeline.
  std::vector<uint8_t> averaged_flags() const;
  // Fails with DSOPT_EINVAL while a step's gradients are being handed over
  // (another collective call would race with the reductions).
  void refuse_while_handing_over(const char* call);
  // The update and what the step reports, once the gradients are prepared.
  StepResult apply(PreparedGrads prepared);

  OptimizerConfig cfg_;
  Comm& comm_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<Kernels> host_;
  ParamSet params_;
  CommRunner runner_;
  RankAgreement agreement_;
  StepPipeline pipeline_;
  HyperGroups groups_;
  AbsentGrads absent_;
  CallHandshake handshake_;
  ReplicationCheck replication_;
  DivergenceCheck divergence_;
  uint64_t run_id_ = 0;
  StateIO io_;
  DeferredGathers gathers_;
  int64_t consecutive_skips_ = 0;
  std::string failure_;            // why the state is inconsistent ("" while intact)
  int failure_status_ = DSOPT_OK;  // the status of the step that failed
  bool last_step_handed_over_ = false;  // the last dsopt_step completed handed-over gradients
  uint64_t handover_bytes_start_ = 0;
  bool resetting_rank_local_ = false;  // see rank_local_world()
  mutable std::string state_names_;  // state_names(), formed on first use
};

}  // namespace dsopt
