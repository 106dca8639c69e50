#include "zero/gradient_reducer.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace dsopt {

GradientReducer::GradientReducer(const ShardLayout& layout, bool reduce_scatter, Comm& comm,
                                 Kernels& kernels, const Mem& mem, Kernels& host,
                                 const ParamSet& params, StepPipeline& pipeline, void* scratch)
    : layout_(layout), reduce_scatter_(reduce_scatter), comm_(comm), kernels_(kernels), mem_(mem),
      host_(host), params_(params), pipeline_(pipeline), send_(static_cast<float*>(scratch)) {
  for (const ReduceBucket& b : layout_.buckets())
    bucket_runs_.push_back(layout_.runs(b.flat_start, b.flat_start + b.numel));
  shard_ = DeviceBuffer(kernels_, size_t(layout_.shard_numel()) * 4);
}

size_t GradientReducer::scratch_bytes(const ShardLayout& layout) {
  if (layout.world() == 1) return 0;  // one rank packs straight into the shard
  int64_t largest = 0;
  for (const ReduceBucket& b : layout.buckets()) largest = std::max(largest, b.numel);
  return size_t(largest) * 4;
}

PreparedGrads GradientReducer::reduce(const dsopt_tensor* grads, int64_t count) {
  const int world = layout_.world();
  const std::string local_error = params_.check_grads(grads, count);
  if (world == 1 && !local_error.empty()) fail(DSOPT_EINVAL, "dsopt_step: " + local_error);
  const bool ok = local_error.empty();

  bool nonfinite = false;
  std::vector<TensorRef> refs;
  for (size_t k = 0; k < layout_.buckets().size(); ++k) {
    const ReduceBucket& b = layout_.buckets()[k];
    // One rank needs no reduction: the bucket is packed into the shard.
    float* packed = world == 1 ? shard() + b.shard_offset : send_;
    int64_t filled = 0;
    if (ok) {
      refs.clear();
      for (const FlatRun& run : bucket_runs_[k]) {
        const dsopt_tensor& g = grads[run.param];
        const auto* base = static_cast<const uint8_t*>(g.data);
        refs.push_back(TensorRef{base + run.param_offset * int64_t(dtype_size(DType(g.dtype))),
                                 run.numel, DType(g.dtype)});
        filled += run.numel;
      }
      if (!refs.empty())
        nonfinite |= kernels_.transform(refs.data(), int64_t(refs.size()), 1.0f, packed, nullptr).nonfinite;
    }
    if (filled < b.numel) kernels_.fill_zero(packed + filled, size_t(b.numel - filled) * 4);
    if (world == 1) continue;
    const int64_t piece = b.numel / world;
    if (reduce_scatter_) {
      comm_.reduce_scatter(packed, shard() + b.shard_offset, size_t(piece), Elem::F32,
                           ReduceOp::Sum, mem_);
    } else {
      comm_.allreduce(packed, packed, size_t(b.numel), Elem::F32, ReduceOp::Sum, mem_);
      kernels_.copy(shard() + b.shard_offset, packed + comm_.rank() * piece, size_t(piece) * 4);
    }
  }

  // a = fl(sum * fl(1/P)) in place; the sums are checked and summed too.
  const bool norm = pipeline_.wants_norm();
  double sumsq = 0.0;
  const TensorRef whole{shard(), layout_.shard_numel(), DType::F32};
  if (world > 1 || norm) {
    const float inv_world = 1.0f / float(world);
    nonfinite |= kernels_.transform(&whole, 1, inv_world, world > 1 ? shard() : nullptr,
                                    norm ? &sumsq : nullptr).nonfinite;
  }
  if (world > 1) {
    double control[2] = {ok ? (nonfinite ? 1.0 : 0.0) : double(StepPipeline::kInvalidStatus), sumsq};
    comm_.allreduce(control, control, 2, Elem::F64, ReduceOp::Sum, Mem{&host_, false});
    if (control[0] >= double(StepPipeline::kInvalidStatus)) pipeline_.fail_step(local_error);
    nonfinite = control[0] > 0.0;
    sumsq = control[1];
  }
  PreparedGrads out;
  out.skip = nonfinite && pipeline_.config().skip_nonfinite;
  pipeline_.set_multipliers(out, sumsq);
  return out;
}

}  // namespace dsopt
