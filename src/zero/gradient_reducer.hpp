// ZeRO's gradient path (spec zero.md section 5, recommended form): this
// rank's local gradients are packed bucket by bucket into an fp32 buffer
// (checked for Inf/NaN on the way), each bucket is reduce-scattered so that
// every rank receives the sum of its own piece, and the shard is averaged
// with fl(1/P) (DECISIONS G3). One scalar allreduce then agrees on the
// status and the global norm.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "kernels/device_buffer.hpp"
#include "optim/param_set.hpp"
#include "optim/step_pipeline.hpp"
#include "zero/shard_layout.hpp"

namespace dsopt {

class GradientReducer {
 public:
  // reduce_scatter false: each bucket is allreduced and the own piece kept
  // (DeepSpeed's traffic, same sums). `scratch` (device memory of at least
  // scratch_bytes(layout)) holds a bucket during reduce(); it is free
  // between calls.
  GradientReducer(const ShardLayout& layout, bool reduce_scatter, Comm& comm, Kernels& kernels,
                  const Mem& mem, Kernels& host, const ParamSet& params, StepPipeline& pipeline,
                  void* scratch);
  static size_t scratch_bytes(const ShardLayout& layout);

  // Collective. Fills shard() with this rank's piece of the averaged
  // gradient and returns the step's status and multipliers (grads empty).
  // Throws Error(DSOPT_EINVAL) on every rank when any rank's gradients do
  // not fit the parameters; nothing has changed then.
  PreparedGrads reduce(const dsopt_tensor* grads, int64_t count);

  // The averaged fp32 gradient of this rank's shard (S elements).
  float* shard() const { return shard_.floats(); }

 private:
  const ShardLayout& layout_;
  bool reduce_scatter_;
  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  Kernels& host_;
  const ParamSet& params_;
  StepPipeline& pipeline_;
  std::vector<std::vector<FlatRun>> bucket_runs_;  // per reduce bucket
  float* send_;         // scratch: one bucket, packed in flat order
  DeviceBuffer shard_;  // S floats
};

}  // namespace dsopt
