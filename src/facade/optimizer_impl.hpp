// What the facade (facade/optimizer.hpp) holds behind its handle, private
// to src/facade: the parts, the algorithm, what only the facade uses (the
// call handshake, the replication check, the failure state), and the
// orchestration of a step and a load across them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "facade/optimizer.hpp"
#include "optim/algorithm_impl.hpp"
#include "optim/call_handshake.hpp"
#include "optim/optimizer_parts.hpp"
#include "optim/replication_check.hpp"

namespace dsopt {

struct Optimizer::Impl {
  Impl(const OptimizerConfig& cfg, Comm& comm, std::unique_ptr<Kernels> kernels,
       const dsopt_tensor* params, int64_t count);

  // Records that the update in progress failed (require_intact).
  void mark_failed(int status, const std::string& what);
  void require_intact(const char* call) const;
  using Call = CallHandshake::Call;
  // Enters a collective call (optim/call_handshake.hpp); `absent` counts
  // only where the algorithm skips absent gradients.
  bool enter_collective(Call call, bool absent = false, bool* someone_abandons = nullptr) {
    return handshake.enter(call, absent && algorithm->skips_absent(), someone_abandons);
  }
  // Fails with DSOPT_EINVAL while a step's gradients are being handed over
  // (another collective call would race with the reductions).
  void refuse_while_handing_over(const char* call);
  // Whether the coming step's gradients are compared across ranks
  // (ReplicationCheck::applies).
  bool checks_replication() const {
    return ReplicationCheck::applies(parts.comm().size(), parts.group_step(0));
  }
  // The step's grads_replicated (ReplicationCheck::check_step) where it is
  // checked, else false.
  bool check_replication(const dsopt_tensor* grads, int64_t count) {
    return checks_replication() &&
           replication.check_step(parts.params(), grads, count, parts.agreement());
  }
  // Opens a step's hand-over window (and posts its handshake).
  void open_window();
  // step() but for the bytes sent.
  StepResult step_uncounted(const dsopt_tensor* grads, int64_t count);
  // Completes a step whose gradients were handed over; `abandon`: this
  // rank's are unusable, and every rank fails the step (DSOPT_EINVAL,
  // nothing changed) once the window's reductions have completed.
  StepResult step_handed_over(bool abandon);
  // The update and what the step reports, once the gradients are prepared.
  StepResult apply(PreparedGrads prepared);
  std::string alarm(bool stuck_at_min_scale, double scale_used) const;
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
  // The masters and the algorithm's state list, described on first use.
  const StateSchema& state_schema() const { return parts.io().state(); }

  OptimizerParts parts;
  std::unique_ptr<AlgorithmImpl> algorithm;  // built on `parts`, destroyed before them
  CallHandshake handshake;
  ReplicationCheck replication;
  int64_t consecutive_skips = 0;
  std::string failure;            // why the state is inconsistent ("" while intact)
  int failure_status = DSOPT_OK;  // the status of the step that failed
  bool last_step_handed_over = false;  // the last dsopt_step completed handed-over gradients
  CommBytes handover_bytes_start;
  mutable std::string state_names;  // Optimizer::state_names(), formed on first use
};

}  // namespace dsopt
