// One step's gradients as they are handed over (dsopt_grad_ready, or
// dsopt_step's own gradients): each parameter's gradient is converted to
// fp32 into a packing of the parameters (checked for Inf/NaN on the way,
// added to what earlier micro-batches left there), the packing is cut into
// reduce buckets, and a bucket's reduction is started as soon as it is
// complete and every bucket after it has started. Buckets are therefore
// reduced from the last to the first on every rank, whatever order the
// gradients arrive in. Where the packing lives and what a reduction is
// belong to the subclass (stage 0 allreduce, ZeRO reduce-scatter).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"

namespace dsopt {

class GradientHandover {
 public:
  virtual ~GradientHandover() = default;

  // Where parameters go: pos[i] is parameter i's first element in the
  // packing (elements numel[i]), and `bucketed` says whether it is inside
  // the bucketed range [0, bucket_ends.back()) or after it (kept local).
  // Bucket k is [bucket_ends[k-1], bucket_ends[k]); elements that belong to
  // no parameter (padding, a status slot) are the subclass's.
  struct Plan {
    std::vector<int64_t> pos, numel;
    std::vector<uint8_t> bucketed;
    std::vector<int64_t> bucket_ends;
  };

  // Starts an accumulation window of `micro_batches` micro-batches.
  void open(Plan plan, int micro_batches);
  bool is_open() const { return open_; }
  const Plan& plan_in_use() const { return plan_; }
  int micro_batches() const { return micro_batches_; }

  // Takes parameter i's gradient of the current micro-batch (already
  // validated: numel fits). A parameter handed over twice in one
  // micro-batch starts the next one. Throws Error(DSOPT_EINVAL), changing
  // nothing, when the parameter was handed over micro_batches times.
  void hand_over(int64_t i, const TensorRef& grad);
  // Hands over every bucketed parameter's gradient at once (grads: one per
  // parameter), one conversion pass per bucket, in a window of one
  // micro-batch with nothing handed over yet; the parameters kept local are
  // left to the caller (they count as handed over, nothing is written).
  void hand_over_bucketed(const TensorRef* grads);
  // Ends the window's hand-overs: parameters without a gradient in a
  // micro-batch contribute zeros; every bucket of every micro-batch has
  // been passed to reduce() afterwards.
  void complete();
  // Forgets the window (after complete(), or to discard it).
  void close() { open_ = false; }

  // Whether some gradient handed over so far had an Inf or NaN.
  bool nonfinite() const { return nonfinite_; }
  // Per parameter: 1 when a gradient of it was handed over in this window
  // (zeros written for a missing one do not count).
  const std::vector<uint8_t>& received() const { return received_; }
  // Where packing position `pos` (inside bucket k; k = -1 for the local
  // range) is stored now.
  float* place(int64_t k, int64_t pos) { return storage(k, pos); }

 protected:
  explicit GradientHandover(Kernels& kernels) : kernels_(kernels) {}

  // The fp32 address of packing position `pos` in bucket k (-1: local) for
  // the current micro-batch.
  virtual float* storage(int64_t k, int64_t pos) = 0;
  // Whether micro-batch m's gradients overwrite their storage (else they
  // are added to it).
  virtual bool fresh(int m) const = 0;
  // Whether the buckets are reduced in micro-batch m.
  virtual bool reduces(int m) const = 0;
  // Bucket k of micro-batch m is complete: start its reduction.
  virtual void reduce(int64_t k, int m) = 0;

  Kernels& kernels_;

 private:
  struct Run {  // a parameter's elements inside one bucket
    int64_t bucket, param_offset, pos, numel;
  };
  void start_micro_batch();
  // Zeros for the parameters missing in the current micro-batch, and the
  // reduction of its remaining buckets.
  void close_micro_batch();
  void write(int64_t i, const TensorRef* grad);  // grad nullptr: zeros
  void reduce_ready();

  Plan plan_;
  std::vector<std::vector<Run>> runs_;  // per parameter
  std::vector<int64_t> bucket_elems_;   // parameter elements per bucket
  std::vector<int64_t> bucket_left_;    // of them still to come in this micro-batch
  std::vector<int> count_;              // hand-overs per parameter in this window
  std::vector<uint8_t> received_;       // parameters with a gradient in this window
  int micro_batches_ = 1;
  int micro_ = 0;
  int64_t missing_ = 0;     // parameters not yet handed over in this micro-batch
  int64_t next_reduce_ = -1;
  bool open_ = false;
  bool nonfinite_ = false;
};

}  // namespace dsopt
