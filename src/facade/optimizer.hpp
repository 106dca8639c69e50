// The object behind a dsopt_optimizer handle: what the C API (src/api)
// calls, and nothing more. It owns the optimizer's parts
// (optim/optimizer_parts.hpp: parameters, groups and hyperparameters, the
// step pipeline, state I/O, deferred gathers, ...), the call handshake,
// the replication check, the failure state and one algorithm
// (optim/algorithm_impl.hpp), and orchestrates a step and a load across
// them: the handshake, the gradient hand-over, absent gradients, what a
// step reports and how a failed one leaves the optimizer. The parts and the
// algorithm live behind Impl (facade/optimizer_impl.hpp), so this header
// is all the C API includes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "dsopt.h"

namespace dsopt {

class Comm;
class Kernels;
struct OptimizerConfig;

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
  uint64_t bytes_inter_node = 0;  // the part of them sent to ranks of other nodes
  // Non-empty when the run is not progressing (docs/design/decisions.md S2):
  // dsopt_step then returns DSOPT_ENONFINITE with this message.
  std::string alarm;
};

class Optimizer {
 public:
  // Builds the parts and the algorithm `cfg` names on the device it names;
  // `params` are borrowed until destruction. Not collective (see
  // facade/creation.hpp). Throws Error on a bad device, communicator or
  // parameters.
  Optimizer(const OptimizerConfig& cfg, Comm& comm, const dsopt_tensor* params, int64_t count);
  // The same on the given kernels (tests: a stand-in device).
  Optimizer(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
            const dsopt_tensor* params, int64_t count);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // ---- steps ----
  // Collective. grads == nullptr with count 0 completes a step whose
  // gradients were handed over with grad_ready.
  StepResult step(const dsopt_tensor* grads, int64_t count);
  // Takes one parameter's gradient of one micro-batch (dsopt_grad_ready);
  // the first of a step starts the handshake. Throws Error(DSOPT_EINVAL),
  // changing nothing, on bad arguments.
  void grad_ready(int64_t param_index, const dsopt_tensor* grad);
  // New storage for every parameter (dsopt_rebind_params): throws
  // Error(DSOPT_EINVAL), changing nothing, on bad descriptors or while
  // gradients are being handed over. Not collective.
  void rebind_params(const dsopt_tensor* params, int64_t count);

  // ---- hyperparameters ----
  // The groups' learning rates and their other hyperparameters by name
  // (dsopt_set_lr, dsopt_get/set_group_param). Throw Error(DSOPT_EINVAL),
  // changing nothing, on a group out of range or a bad name or value;
  // set_lr sets every group's.
  int32_t num_groups() const;
  double lr(int32_t group) const;
  void set_lr(double lr);
  void set_group_lr(int32_t group, double lr);
  double group_param(int32_t group, const std::string& name) const;
  void set_group_param(int32_t group, const std::string& name, double value);
  double loss_scale() const;
  double gradient_clipping() const;
  // Throws Error(DSOPT_EINVAL), changing nothing, while gradients are being
  // handed over (the step in progress decides on the norm's collectives).
  void set_gradient_clipping(double max_norm);

  // ---- parameters ----
  // Updates applied to parameter i (dsopt_get_param_step); set_param_step
  // throws Error(DSOPT_EUNSUPPORTED) where steps follow the stages.
  int64_t param_step(int64_t param_index) const;
  void set_param_step(int64_t param_index, int64_t step);
  // numel and group of parameter i (throws Error(DSOPT_EINVAL) when out of range).
  int64_t param_numel(int64_t param_index, int32_t* group) const;
  // The momentum mask of a parameter (1-bit optimizers); nullptr clears it.
  // Throws Error(DSOPT_EUNSUPPORTED) where the algorithm has none.
  void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask);

  // ---- state ----
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
  uint64_t save(void* dst, uint64_t capacity) const;
  // Validates the whole blob, then restores it. Collective. `flags`:
  // DSOPT_LOAD_RESET_RANK_LOCAL, DSOPT_LOAD_WITHOUT_RANK_LOCAL or 0.
  // Returns whether rank-local state was reset (some rank's blob was saved
  // by another rank, or carries none).
  bool load(const void* src, uint64_t size, uint32_t flags = 0);
  // Validates every blob of a saved run (all ranks' blobs in rank order, or
  // one replica of replicated state), then restores this rank's state from
  // them: resharded where the algorithm supports it, else the blob of this
  // rank (same world size) or the first one. Collective.
  void load_shards(const void* const* blobs, const uint64_t* sizes, int64_t count);

  // Bytes of the buffers dsopt holds for this optimizer, in host and in
  // device memory (the caller's parameters are not counted).
  struct MemoryUsage {
    uint64_t host = 0, device = 0;
  };
  MemoryUsage memory_usage() const;
  // The part of them that is state the blob saves (the state schema's
  // arrays); the rest are gradient, scratch and communication buffers.
  MemoryUsage state_memory_usage() const;

  // ---- the deferred parameter allgather of ZeRO (optim/deferred_gathers.hpp) ----
  // In gather order (optim/gather_order.hpp: the shard layout's, or the one
  // set_gather_order gave). gather_buckets() is the number of buckets (0
  // when parameters are never gathered: stage 0, one rank),
  // gather_bucket_of(i) the position in gather order after which parameter
  // i is whole (-1: always whole).
  int64_t gather_buckets() const;
  int64_t gather_bucket_of(int64_t param_index) const;
  // Collective (dsopt_gather_order): the order in which the caller needs
  // the parameters, a permutation of their indices (count 0: the default
  // order), from the next step on. Throws, changing nothing on any rank:
  // Error(DSOPT_EINVAL) on a rank whose order is not a permutation
  // (DSOPT_EMISMATCH on the others), Error(DSOPT_EMISMATCH) on every rank
  // when the ranks' orders differ.
  void set_gather_order(const int64_t* order, int64_t count);
  // Buckets of the last step not yet known to have arrived.
  int64_t gathers_pending();
  // Waits until buckets 0 .. `bucket` have arrived (-1: every bucket, and
  // other optimizers' gathers on the communicator). A failed gather marks
  // the optimizer failed (require_intact) and throws its status; `call`
  // names the entry point.
  void wait_gathers(int64_t bucket, const char* call);

  // ---- creation (facade/creation.hpp) ----
  // Collective, once every rank has built its optimizer and the ranks agree.
  void created();
  // The identifier of this run, the same on every rank; blobs carry it so
  // that blobs of different runs are not mixed. Set after creation.
  void set_run_id(uint64_t id);
  // A hash of samples of the parameters' current values.
  uint64_t params_fingerprint() const;
  // The CPU threads of this optimizer's host work (its kernels, on the
  // CPU), and the default given at create to a config without "threads".
  int threads() const;
  void set_default_threads(int threads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsopt
