// The update rules that keep fp32 moments (m and v, or m alone) and
// nothing else between steps: elementwise ones (Adam/AdamW, Lion: the
// algorithm's UpdateRule with adam_step_consts) and LAMB (per tensor: a
// trust ratio from the norms of p and u). Each runs on either gradient path: replicated
// (ReplicatedOptimizer: every rank averages every gradient and updates
// every element) or sharded (ZeroOptimizer, ZeRO stage 1/2: every rank
// updates its shard's fragments), with the same results bit for bit where
// the averaged gradients are the same. The per-step constants here serve
// the 1-bit optimizers too (1-bit LAMB reads lamb_step_consts).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/moment_rules/adam_step_consts.hpp"
#include "optim/config.hpp"
#include "algorithms/lamb/lamb_step.hpp"
#include "optim/optimizer_parts.hpp"
#include "optim/step_pipeline.hpp"

namespace dsopt {

// The rule of a config whose algorithm has one (Algorithm::rule).
MomentRule moment_rule(const OptimizerConfig& cfg);
// Whether the config's algorithm has one.
bool has_moment_rule(const OptimizerConfig& cfg);
// The algorithm's name in blobs (Algorithm::blob_name, else its type).
std::string moment_algorithm(const OptimizerConfig& cfg);
// The descriptor of an elementwise rule `update` keeping `moments`: built
// by make_moment_rule, on every gradient path (stage 0, ZeRO stage 1/2,
// compressed ZeRO, and CPU offload of a CUDA optimizer's shard), with
// Adam's hyperparameters until the caller sets its own.
Algorithm elementwise_algorithm(const char* type, UpdateRule update, MomentNames moments);
// A moment rule's implementation on the config's gradient path
// (ZeroOptimizer at ZeRO stage 1/2, else ReplicatedOptimizer): the
// Algorithm::make of every moment rule's descriptor.
std::unique_ptr<AlgorithmImpl> make_moment_rule(OptimizerParts& parts);

// This step's Adam constants: per group, or per parameter when steps
// differ or parameters are left out (call from an update).
AdamStepConsts adam_step_consts(const OptimizerParts& parts);
// This step's LAMB constants, per parameter (math/onebit_lamb.hpp), at
// the parameter's own update count; bias-corrected as its group says.
LambStepConsts lamb_step_consts(const OptimizerParts& parts);
// One update of a moment rule over `slots`: whole tensors or a shard's
// fragments, param_of(k) the parameter of slot k, whose group is its
// parameter's group; LAMB's slots carry the U stream and `sums` gives it
// the per-tensor sums of squares (lamb_step.hpp). Returns the gradients'
// sum of squares where grads.norm_by_update asks (0 otherwise).
double update_moments(const OptimizerParts& parts, MomentRule rule,
                      const std::vector<UpdateSlot>& slots,
                      const std::function<int64_t(size_t)>& param_of, const PreparedGrads& grads,
                      const TensorSums& sums);

}  // namespace dsopt
