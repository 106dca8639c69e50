// ZeRO's gradient path (docs/design/zero.md section 5, recommended form): this
// rank's local gradients are packed bucket by bucket into fp32 (checked for
// Inf/NaN on the way), each bucket is reduce-scattered as soon as it is
// complete so that every rank receives the sum of its own piece, and the
// shard is averaged with fl(1/(P*G)) (docs/design/decisions.md G3). One scalar allreduce
// then agrees on the status and the global norm.
//
// Gradients come all at once (dsopt_step) or one by one (dsopt_grad_ready,
// src/handover). Over G micro-batches stage 2 reduces every micro-batch and
// adds the reduced pieces to the shard in fp32; stage 1 adds the local
// gradients in one fp32 buffer of the whole model and reduces once, in the
// last micro-batch. Bucket buffers come from a pool: the first is the
// scratch shared with the parameter allgather, more are made only while
// reductions run behind backward.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "handover/gradient_handover.hpp"
#include "kernels/device_buffer.hpp"
#include "comm/rank_agreement.hpp"
#include "params/param_set.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

// What the reduction of a step's gradients found, agreed across ranks.
struct ReducedShard {
  bool nonfinite = false;  // some rank had a non-finite gradient, or a sum is one
  double sumsq = 0.0;      // of the averaged gradient over every shard (when asked for)
};

class GradientReducer final : public GradientHandover {
 public:
  // reduce_scatter false: each bucket is allreduced and the own piece kept
  // (DeepSpeed's traffic, same sums). `scratch` (device memory of at least
  // scratch_bytes(layout)) holds a bucket during reduce(); it is free
  // between steps.
  GradientReducer(const ShardLayout& layout, int stage, bool reduce_scatter, Comm& comm,
                  Kernels& kernels, const Mem& mem, const ParamSet& params,
                  RankAgreement& agreement, CommRunner& runner, void* scratch);
  static size_t scratch_bytes(const ShardLayout& layout);

  // Collective. Fills shard() with this rank's piece of the averaged
  // gradient and returns what the ranks found (the sum of squares when
  // `norm`). Fails the step on every rank when any rank's gradients do not
  // fit the parameters (RankAgreement); nothing has changed then.
  ReducedShard reduce_at_once(const dsopt_tensor* grads, int64_t count, bool norm);
  // Opens a window for gradients handed over one by one.
  void open_handover(int micro_batches);
  // Collective, after the window is complete and the runner has finished.
  ReducedShard reduce_handed_over(bool norm);

  // The averaged fp32 gradient of this rank's shard (S elements).
  float* shard() const { return shard_.floats(); }

 protected:
  float* storage(int64_t k, int64_t pos) override;
  bool fresh(int m) const override;
  bool reduces(int m) const override;
  void reduce(int64_t k, int m) override;

 private:
  struct Buffer {
    float* send = nullptr;  // one bucket, packed in flat order
    DeviceBuffer own;       // send's memory, unless it is the scratch
    DeviceBuffer received;  // a reduced piece to add to the shard
  };
  // Bucket buffers kept while reductions run behind backward: one filling,
  // two being reduced.
  static constexpr size_t kBuffers = 3;
  struct InFlight {
    uint64_t ticket;
    size_t buffer;
    int64_t bucket;
    bool add;  // the piece arrived in `received`: add it to the shard
  };
  Plan flat_plan() const;
  bool accumulates_locally() const;  // stage 1 over several micro-batches
  // Returns the buffers of finished reductions to the pool (all: wait for
  // every one), adding received pieces to the shard in posting order.
  void reclaim(bool all);
  // Steps 2-4 once every reduction has finished: average, check, agree.
  ReducedShard finish(float mul, bool nonfinite, bool norm, const std::string& local_error);

  const ShardLayout& layout_;
  int stage_;
  bool reduce_scatter_;
  Comm& comm_;
  Mem mem_;
  const ParamSet& params_;
  RankAgreement& agreement_;
  CommRunner& runner_;
  void* scratch_;
  std::vector<Buffer> pool_;
  std::vector<size_t> free_;
  std::vector<InFlight> in_flight_;
  std::vector<int64_t> bucket_buffer_;  // per bucket: its pool buffer in this micro-batch, or -1
  DeviceBuffer local_sum_;  // stage 1 over several micro-batches: the flat gradient
  DeviceBuffer shard_;      // S floats
};

}  // namespace dsopt
