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

enum class MomentRule { Adam, Lamb };

// The rule of a config whose type has one (Adam, AdamW, Lamb).
MomentRule moment_rule(const OptimizerConfig& cfg);
// Whether the config's type is one of them.
bool has_moment_rule(const OptimizerConfig& cfg);
// The algorithm's name in blobs: "Adam", "AdamW" or "Lamb".
std::string moment_algorithm(const OptimizerConfig& cfg);
// The blob sections' prefix of its moments.
const char* moments_prefix(MomentRule rule);

}  // namespace dsopt
