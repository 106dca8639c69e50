// The update rules that keep fp32 moments m and v and nothing else between
// steps: Adam/AdamW (elementwise) and LAMB (per tensor: a trust ratio from
// the norms of p and u). Each runs on either gradient path: replicated
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
// The algorithm's name in blobs: its type, except that Adam with
// decoupled weight decay ("adam_w_mode") saves as "AdamW".
std::string moment_algorithm(const OptimizerConfig& cfg);
// The blob sections' prefix of its moments.
const char* moments_prefix(MomentRule rule);
// The update rule of an elementwise moment rule (Adam, Lion), whose
// constants are adam_step_consts'.
UpdateRule elementwise_rule(MomentRule rule);

}  // namespace dsopt
