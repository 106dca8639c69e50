// The parsed, validated configuration an optimizer is built from
// (src/api/config.cpp fills it from JSON).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "base/error.hpp"
#include "math/adam.hpp"
#include "optim/algorithm.hpp"
#include "zero/compression.hpp"

namespace dsopt {

struct LossScaleConfig {
  bool enabled = false;         // fp16.enabled
  double static_scale = 0.0;    // fp16.loss_scale (> 0: static)
  int initial_scale_power = 16;
  int64_t window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;
};

// "divergence_check" (docs/reference/c-api.md "Divergence that stays finite"; the rule in
// optim/divergence_check.hpp).
struct DivergenceConfig {
  bool enabled = true;
  double factor = 20.0;    // a step is above when its norm exceeds factor x the reference
  int64_t min_steps = 10;  // observed steps before any step can be above
  int64_t horizon = 50;    // the reference's averaging horizon, in observed steps
  int count = 3;           // an episode starts when `count` of the last `window` steps were above
  int window = 8;          // and ends once `window` steps in a row were not (at most 64)
};

struct PipelineConfig {
  LossScaleConfig loss_scale;
  DivergenceConfig divergence;
  double gradient_clipping = 0.0;
  bool skip_nonfinite = true;
  bool report_grad_norm = false;
  // dsopt_step returns DSOPT_ENONFINITE after this many skipped steps in a
  // row, and when fp16 loss scaling overflows at min_loss_scale; 0: never.
  int64_t max_consecutive_skips = 50;
  // NCCL: seconds a collective may wait before the communicator is aborted
  // and the call fails with DSOPT_ECOMM; 0: no limit.
  double comm_timeout_s = 0.0;
};

// zero_optimization (docs/design/zero.md section 2; docs/guides/zero.md "ZeRO").
struct ZeroConfig {
  int stage = 0;                           // 0: replicated state; 1, 2: sharded (ZeroOptimizer)
  int64_t reduce_bucket_size = 500000000;  // elements per gradient reduce-scatter
  int64_t allgather_bucket_size = 500000000;  // elements gathered per parameter allgather
  bool reduce_scatter = true;              // false: allreduce each bucket (2x the traffic)
  // The parameter allgather after the update runs behind the caller's next
  // forward, bucket by bucket (docs/guides/zero.md "Deferred allgather").
  bool deferred_allgather = false;
  // offload_optimizer.device "cpu": a CUDA optimizer keeps the shard's
  // masters and moments in host memory (pinned with pin_memory) and updates
  // them with the CPU kernels. Nothing changes on a CPU optimizer.
  bool offload_cpu = false;
  bool pin_memory = false;
  int64_t offload_tile = int64_t(1) << 20;  // elements updated between uploads (not a config key)
  // compression (docs/guides/compressed-zero.md): the codec of the gradient
  // reduce-scatter and of the parameter allgather, at 2 or more ranks.
  ZeroCompression compression;
};

// "topology" (docs/guides/multi-node.md): how the compressed collectives
// run across nodes.
struct TopologyConfig {
  // Auto: node-aware where the ranks span several nodes of more than one
  // rank each, else flat; Flat: always the flat form; NodeAware: always the
  // node-aware form, an error where the nodes cannot be had.
  enum class Hierarchy { Auto, Flat, NodeAware };
  Hierarchy hierarchy = Hierarchy::Auto;
  // > 0: nodes declared as consecutive blocks of this many ranks (rank / R);
  // 0: found from the communicator.
  int ranks_per_node = 0;
  // node_reduce "1bit": the node-aware 1-bit allreduce reduces inside the
  // node with 1-bit codes (NodeAwareAllreduce's 1-bit node step) instead
  // of fp32; the 1-bit family only.
  bool onebit_node = false;
};

struct OptimizerConfig {
  const Algorithm* algorithm = nullptr;  // its descriptor (src/algorithms)
  std::string type;                      // algorithm->type
  bool cuda = false;
  bool cuda_aware = false;
  int threads = 0;
  // gradient_accumulation_steps: hand-overs per parameter and step
  // (dsopt_grad_ready); dsopt_step's gradients are a whole step's.
  int micro_batches = 1;
  AdamHyper defaults;             // optimizer.params
  std::vector<AdamHyper> groups;  // one per group (defaults + param_groups overrides)
  std::vector<bool> non_freeze;   // per group: 1-bit optimizers keep it uncompressed
  // The algorithm's own settings beyond the hyperparameters, as its
  // descriptor's read_params makes them (a struct of its family's folder:
  // the 1-bit schedules, LAMB's trust-ratio bounds); nullptr: none.
  std::shared_ptr<const AlgorithmSettings> settings;
  // The settings as the family's type T; throws Error(DSOPT_EINTERNAL)
  // when the algorithm has none of that type.
  template <class T>
  const T& settings_as() const {
    const T* s = dynamic_cast<const T*>(settings.get());
    if (!s) fail(DSOPT_EINTERNAL, type + " has no settings of the type asked for");
    return *s;
  }
  PipelineConfig pipeline;
  ZeroConfig zero;
  TopologyConfig topology;
  std::string canonical;          // normalised JSON text, for cross-rank agreement
  std::string run_canonical;      // the same without how it runs (device, threads, cuda_aware, comm_timeout, offload, the allgather's buckets and deferral): names a run
};

}  // namespace dsopt
