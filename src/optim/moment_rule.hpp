// The update rules that keep fp32 moments (m and v, or m alone) and
// nothing else between steps: elementwise ones (Adam/AdamW, Lion: the
// algorithm's UpdateRule with adam_step_consts) and LAMB (per tensor: a
// trust ratio from the norms of p and u). Each runs on either gradient path: replicated
// (ReplicatedOptimizer: every rank averages every gradient and updates
// every element) or sharded (ZeroOptimizer, ZeRO stage 1/2: every rank
// updates its shard's fragments), with the same results bit for bit where
// the averaged gradients are the same.
#pragma once
#include <string>

#include "optim/config.hpp"

namespace dsopt {

// The rule of a config whose algorithm has one (Algorithm::rule).
MomentRule moment_rule(const OptimizerConfig& cfg);
// Whether the config's algorithm has one.
bool has_moment_rule(const OptimizerConfig& cfg);
// The algorithm's name in blobs (Algorithm::blob_name, else its type).
std::string moment_algorithm(const OptimizerConfig& cfg);

}  // namespace dsopt
