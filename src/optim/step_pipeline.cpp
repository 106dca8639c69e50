#include "optim/step_pipeline.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"

namespace dsopt {
namespace {
// Status flag carried next to the gradients: 1 per rank with a non-finite
// gradient, kInvalid per rank whose arguments were rejected.
constexpr float kInvalid = 65536.0f;
}  // namespace

StepPipeline::StepPipeline(const PipelineConfig& cfg, Comm& comm, Kernels& kernels,
                           const Mem& mem, Kernels& host, const ParamSet& params)
    : cfg_(cfg), comm_(comm), kernels_(kernels), mem_(mem), host_(host), params_(params),
      scaler_(cfg.loss_scale) {}

std::vector<TensorRef> StepPipeline::caller_grads(const dsopt_tensor* grads, int64_t count) const {
  std::vector<TensorRef> refs;
  for (int64_t i = 0; i < count; ++i)
    refs.push_back(TensorRef{grads[i].data, grads[i].numel, DType(grads[i].dtype)});
  return refs;
}

void StepPipeline::fail_step(const std::string& local_error) {
  // Error path only: one more collective tells every rank who failed.
  const int world = comm_.size();
  int64_t mine = local_error.empty() ? 0 : 1;
  std::vector<int64_t> all(size_t(world), 0);
  comm_.allgather(&mine, all.data(), 1, Elem::I64, Mem{&host_, false});
  if (!local_error.empty()) fail(DSOPT_EINVAL, "dsopt_step: " + local_error);
  std::string ranks;
  for (int r = 0; r < world; ++r)
    if (all[size_t(r)]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  fail(DSOPT_EINVAL, "dsopt_step: rank " + ranks +
                         " passed gradients that do not fit the parameters (see that rank's "
                         "error); no rank changed anything");
}

void StepPipeline::set_multipliers(PreparedGrads& out, double sumsq) const {
  const double scale = scaler_.scale();
  double coef = 1.0;
  if (wants_norm()) {
    out.grad_norm = std::sqrt(sumsq) / scale;
    if (cfg_.gradient_clipping > 0.0)
      coef = std::min(1.0, cfg_.gradient_clipping / (out.grad_norm + 1e-6));
  }
  out.mul2 = float(coef / scale);
}

PreparedGrads StepPipeline::prepare(const dsopt_tensor* grads, int64_t count, GradMode mode) {
  const int world = comm_.size();
  const std::string local_error = params_.check_grads(grads, count);
  if (world == 1 && !local_error.empty()) fail(DSOPT_EINVAL, "dsopt_step: " + local_error);

  PreparedGrads out;
  const int64_t n = params_.count();
  double sumsq = 0.0;
  bool nonfinite = false;

  if (world > 1 && mode == GradMode::Averaged) {
    // Local gradients -> one fp32 buffer (checked on the way), the status
    // flag in its last element; one allreduce carries both.
    const int64_t total = params_.total_numel();
    if (!averaged_.get()) averaged_ = DeviceBuffer(kernels_, size_t(total + 1) * 4);
    float* buf = averaged_.floats();
    float flag = kInvalid;
    if (local_error.empty()) {
      const std::vector<TensorRef> refs = caller_grads(grads, count);
      flag = kernels_.transform(refs.data(), n, 1.0f, buf, nullptr).nonfinite ? 1.0f : 0.0f;
    }
    kernels_.copy_from_host(buf + total, &flag, 4);
    comm_.allreduce(buf, buf, size_t(total + 1), Elem::F32, ReduceOp::Sum, mem_);
    kernels_.copy_to_host(&flag, buf + total, 4);
    if (flag >= kInvalid) fail_step(local_error);
    nonfinite = flag > 0.0f;
    // a = fl(sum * fl(1/P)), in place; the sums are checked as well.
    const TensorRef whole{buf, total, DType::F32};
    const float inv_world = 1.0f / float(world);
    nonfinite |= kernels_.transform(&whole, 1, inv_world, buf, wants_norm() ? &sumsq : nullptr).nonfinite;
    out.grads.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      const Param& p = params_.params()[size_t(i)];
      out.grads[i] = TensorRef{buf + p.offset, p.numel, DType::F32};
    }
  } else {
    std::vector<double> per_tensor(size_t(n), 0.0);
    if (local_error.empty()) {
      out.grads = caller_grads(grads, count);
      if (cfg_.skip_nonfinite || wants_norm())
        nonfinite = kernels_.transform(out.grads.data(), n, 1.0f, nullptr,
                                       wants_norm() ? per_tensor.data() : nullptr)
                        .nonfinite;
      for (double s : per_tensor) sumsq += s;
    }
    if (world > 1) {
      // Local gradients stay local; ranks agree on status and the norm
      // sqrt(mean_i ||g_i||^2) through one small allreduce.
      double control[2] = {local_error.empty() ? (nonfinite ? 1.0 : 0.0) : double(kInvalid), sumsq};
      comm_.allreduce(control, control, 2, Elem::F64, ReduceOp::Sum, Mem{&host_, false});
      if (control[0] >= double(kInvalid)) fail_step(local_error);
      nonfinite = control[0] > 0.0;
      sumsq = control[1] / world;
    }
  }

  out.skip = nonfinite && cfg_.skip_nonfinite;
  set_multipliers(out, sumsq);
  return out;
}

}  // namespace dsopt
