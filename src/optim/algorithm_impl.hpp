// The interface every algorithm implements: its state, its update and the
// hooks a gradient path or an algorithm family may need. The facade
// (facade/optimizer.hpp) owns one and calls it; the algorithm never sees
// the facade or the C API, only the optimizer's parts
// (optim/optimizer_parts.hpp) it is given at construction. The factory
// (optim/factory.hpp) builds the one a config names.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optim/optimizer_parts.hpp"
#include "optim/state_io.hpp"
#include "optim/step_pipeline.hpp"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class AlgorithmImpl {
 public:
  // `parts` outlive the algorithm.
  explicit AlgorithmImpl(OptimizerParts& parts) : parts_(parts) {}
  virtual ~AlgorithmImpl() = default;
  AlgorithmImpl(const AlgorithmImpl&) = delete;
  AlgorithmImpl& operator=(const AlgorithmImpl&) = delete;

  // ---- what every algorithm has ----
  // Its name in blobs ("AdamW", "Adam", ...).
  virtual std::string blob_name() const = 0;
  // Its own state, section by section (state/state_schema.hpp): saved,
  // checked (throw, change nothing), restored and shown as state views from
  // this list. The entries restore into this object; describing them
  // changes nothing. ("master" of a 16-bit parameter is the parameter
  // set's view unless the list has one.)
  virtual void describe_state(StateSchema& s) = 0;
  // Applies one update with prepared gradients; step counters are already
  // incremented. Returns whether the step used compressed communication
  // and, where grads.norm_by_update asks, the gradients' sum of squares.
  virtual UpdateOutcome update(const PreparedGrads& grads) = 0;

  // ---- optional hooks ----
  // Collective, once every rank has built its optimizer and the ranks
  // agree (dsopt_create): what creation needs the other ranks for.
  virtual void created() {}
  // Whether parameter i's gradient is averaged over ranks in the coming
  // step (else it stays this rank's own).
  virtual bool averaged(int64_t param_index) const {
    (void)param_index;
    return true;
  }
  // Whether update() sums the squares of the gradients it reads when
  // PreparedGrads::norm_by_update asks it to.
  virtual bool update_sums() const { return false; }
  // Checks, averages, unscales and clips the gradients (the step pipeline);
  // ZeRO reduce-scatters them into its shard instead. Collective.
  virtual PreparedGrads prepare(const dsopt_tensor* grads, int64_t count);
  // The same for gradients handed over one by one: where they go, opening
  // a window of G micro-batches, and (collective, after the window's
  // reductions have finished) the prepared gradients.
  virtual GradientHandover& handover() { return parts_.pipeline().handover(); }
  virtual void open_handover(int micro_batches);
  virtual PreparedGrads prepare_handed_over() {
    return parts_.pipeline().prepare_handed_over(update_sums());
  }
  // Whether a parameter whose gradient is absent on every rank is left
  // alone, state and step count included (Adam/AdamW), rather than stepped
  // with a zero gradient (the 1-bit optimizers; see dsopt_step).
  virtual bool skips_absent() const { return false; }
  // The parameter allgather as buckets (chunks) for dsopt_gather_*, and
  // the chunks that write parameter i (ascending; none: never gathered);
  // an algorithm that gathers overrides both.
  virtual int64_t num_gather_chunks() const { return 0; }
  virtual std::vector<int64_t> gather_chunks_of(int64_t param_index) const {
    (void)param_index;
    return {};
  }
  // The DSOPT_PHASE_* of an applied step whose update() returned `compressed`.
  virtual int32_t step_phase(bool compressed) const {
    return compressed ? DSOPT_PHASE_COMPRESSED : DSOPT_PHASE_FULL;
  }
  // What to try when steps keep being skipped (the DSOPT_ENONFINITE message).
  virtual std::string divergence_hint() const { return "try a lower lr or \"gradient_clipping\""; }
  // What of a (checked) blob's state belongs to the rank that saved it, in
  // words for messages ("" when nothing): restored only by that rank at the
  // same world size, reset elsewhere (OptimizerParts::rank_local_world).
  virtual std::string rank_local_state(const BlobReader& r) const {
    (void)r;
    return "";
  }
  // Whether loading (checked) blob `r` here resets rank-local state it
  // holds because it belongs to another world size or topology (the 1-bit
  // compression errors, ZeRO's residual): dsopt_state_load_ex reports it
  // as a reset.
  virtual bool drops_rank_local(const BlobReader& r) const {
    (void)r;
    return false;
  }
  // Resharding for dsopt_state_load_shards: validates `blobs` (a checked
  // set, see StateIO::read_set) and returns what restores this rank's state
  // from them, or nullptr when the algorithm does not reshard (one blob is
  // restored then). Throws, changing nothing, when they cannot be loaded.
  using Blobs = StateIO::Blobs;
  virtual std::function<void()> reshard(const Blobs& blobs) {
    (void)blobs;
    return nullptr;
  }
  // The momentum mask of a parameter (1-bit optimizers); nullptr clears it.
  // Throws Error(DSOPT_EUNSUPPORTED) where the algorithm has none.
  virtual void set_momentum_mask(int64_t param_index, const dsopt_tensor* mask);

 protected:
  OptimizerParts& parts_;
};

}  // namespace dsopt
