// What every optimizer does with gradients before its update (docs/design/decisions.md
// G3-G6): argument checks agreed across ranks, non-finite check, averaging,
// unscaling, clipping; and the loss-scale update after it.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "comm/rank_agreement.hpp"
#include "handover/packed_allreduce.hpp"
#include "kernels/device_buffer.hpp"
#include "optim/config.hpp"
#include "optim/loss_scaler.hpp"
#include "optim/shard_group.hpp"
#include "params/param_set.hpp"

namespace dsopt {

struct PreparedGrads {
  bool skip = false;              // a non-finite gradient somewhere: skip this step
  std::vector<TensorRef> grads;   // one per parameter: what the update reads
  float mul1 = 1.0f, mul2 = 1.0f; // the update multiplies each element by mul1, then mul2
  double grad_norm = -1.0;        // unscaled, before clipping; -1 when not computed (wants_norm)
  bool local_norm = false;        // at P > 1 some gradient stayed local: the norm is
                                  // sqrt(mean over ranks of ||g_r||^2) of that part
  // The norm is left to the update (StepPipeline::prepare's update_sums):
  // the update sums the squares of the gradients it reads (Kernels::update
  // with sums) and returns the sum (UpdateOutcome::grad_sumsq), from which
  // take_norm() sets grad_norm.
  bool norm_by_update = false;
};

// What an update did: whether it used compressed communication, and where
// PreparedGrads::norm_by_update asked for it, the sum of squares of the
// gradients it read (tensor by tensor, as the step pipeline's pass sums).
struct UpdateOutcome {
  bool compressed = false;
  double grad_sumsq = 0.0;
};

class StepPipeline {
 public:
  // Averaged gradients are reduced in buckets of bucket_elems elements,
  // through `runner`; a failed step is settled through `agreement`, and
  // over the shard group of `comm` (dsopt_comm_set_shards) where it has one.
  StepPipeline(const PipelineConfig& cfg, Comm& comm, Kernels& kernels, const Mem& mem,
               const ParamSet& params, CommRunner& runner, RankAgreement& agreement,
               int64_t bucket_elems);

  // Collective (over the shard group too). averaged[i] says whether parameter i's gradient is averaged
  // over ranks (Adam; warmup stages) or stays this rank's own (compressed
  // stages). Throws Error(DSOPT_EINVAL) on every rank when any rank's
  // gradients do not fit the parameters; nothing has changed then.
  // update_sums: the caller's update can sum the squares of the gradients
  // it reads (see norm_after_update).
  PreparedGrads prepare(const dsopt_tensor* grads, int64_t count,
                        const std::vector<uint8_t>& averaged, bool update_sums);
  // The same for gradients handed over (dsopt_grad_ready): open a window,
  // hand gradients to handover(), complete it and wait for the runner, then
  // prepare_handed_over() (collective).
  void open_handover(const std::vector<uint8_t>& averaged, int micro_batches);
  GradientHandover& handover() { return packed_; }
  PreparedGrads prepare_handed_over(bool update_sums);
  // After the update: grad_norm from what it summed, where it was left to it.
  void take_norm(PreparedGrads& prepared, const UpdateOutcome& updated) const;
  // Updates the loss scale with the step's outcome. Returns true when the
  // step overflowed with the dynamic scale already at its minimum.
  bool finish(const PreparedGrads& prepared) { return scaler_.update(prepared.skip); }

  LossScaler& scaler() { return scaler_; }
  const LossScaler& scaler() const { return scaler_; }

  // Pieces for optimizers that prepare gradients their own way (ZeRO).
  const PipelineConfig& config() const { return cfg_; }
  // Whether the step computes the global gradient norm: for clipping,
  // info.grad_norm or the divergence check (fused into a pass over the
  // gradients that runs anyway: the non-finite check's, the averaging, or
  // the update's own reading of them, norm_after_update).
  bool wants_norm() const { return reports_norm() || cfg_.divergence.enabled; }
  // Whether info.grad_norm reports it (else -1).
  bool reports_norm() const { return cfg_.gradient_clipping > 0.0 || cfg_.report_grad_norm; }
  // "gradient_clipping" from the next step on (0: off).
  void set_gradient_clipping(double max_norm) { cfg_.gradient_clipping = max_norm; }
  // out.grad_norm (unless left to the update) and out.mul2 (unscale and
  // clip) from the global sum of squares of the averaged, still scaled
  // gradients.
  void set_multipliers(PreparedGrads& out, double sumsq) const;
  // Fails the step on every rank: its own error on a rank that failed
  // (`mine`: DSOPT_EINVAL for bad arguments, DSOPT_EMISMATCH for a shard
  // peer's), DSOPT_EMISMATCH naming those ranks on the others.
  [[noreturn]] void fail_step(const LocalOutcome& mine);

 private:
  std::vector<TensorRef> caller_grads(const dsopt_tensor* grads, int64_t count) const;
  // After the buckets' reductions: the status they carried (failing the
  // step when some rank's arguments were bad), then the average
  // fl(sum * mul) in place, checked, its sum of squares added to *sumsq; the
  // averaged parameters' gradients in out.grads point into it. Returns
  // whether some rank had a non-finite gradient or a sum is non-finite.
  bool finish_averaged(PreparedGrads& out, float mul, const LocalOutcome& mine,
                       double* sumsq);
  // One small allreduce that agrees on status and the mean over ranks of the
  // local parts' sums of squares.
  bool agree(bool nonfinite, double* local_sumsq, const LocalOutcome& mine);
  // Whether the norm is left to an update that can sum (update_sums): only
  // the divergence check wants it (after the update: no clipping, nothing
  // reports it), the gradients the update reads are the ones summed (one
  // rank, no mean to take first) and the kernels sum while updating. The
  // gradients then get no pass for it, only the non-finite check if any.
  bool norm_after_update(bool update_sums, int micro_batches) const;
  // The unscaled norm from a sum of squares of scaled gradients.
  double norm_of(double sumsq) const;
  // After the reductions over comm: the non-finite flag and the sum of
  // squares of this rank's shards added over the shard group (where there
  // is one), and the multipliers from it.
  void finish_prepared(PreparedGrads& out, bool nonfinite, double sumsq,
                       const LocalOutcome& mine);

  PipelineConfig cfg_;
  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  const ParamSet& params_;
  LossScaler scaler_;
  PackedAllreduce packed_;  // the status flag and the averaged gradients
  CommRunner& runner_;
  RankAgreement& agreement_;
  ShardGroup shards_;  // the ranks holding the parameters' other shards
};

}  // namespace dsopt
