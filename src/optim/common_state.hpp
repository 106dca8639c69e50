// The sections every optimizer's blob begins with (state/section_names.hpp),
// described once as state schema entries: the group step counters, the
// learning rates, the loss scaler, the run id, the parameter step counters,
// the other group hyperparameters and the divergence check's state; and,
// ahead of the algorithm's own state, the masters of 16-bit parameters.
// Saving, checking and restoring them follow from the entries.
#pragma once
#include <cstdint>

#include "kernels/kernels.hpp"
#include "optim/divergence_check.hpp"
#include "optim/hyper_groups.hpp"
#include "optim/loss_scaler.hpp"
#include "params/param_set.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

// What the common sections save and restore; it outlives the schema.
struct CommonState {
  HyperGroups& groups;
  LossScaler& scaler;
  uint64_t& run_id;  // the run's identifier (OptimizerParts::set_run_id)
  DivergenceCheck& divergence;
};

// The common sections but the masters, in blob order. Blobs of an earlier
// layout may lack the run id (restored as it is), the parameter steps
// (their groups' steps), the hyperparameters (the config's stay) and the
// divergence state (the check starts over).
void describe_common_state(StateSchema& s, const CommonState& c);

// common.masters: the fp32 masters of `params`' 16-bit parameters (none
// under ZeRO, which keeps its shard's in its own state), rounded into the
// caller's parameters once restored.
void describe_masters(StateSchema& s, ParamSet& params, Kernels& kernels);

}  // namespace dsopt
