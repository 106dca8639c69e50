#include "optim/step_pipeline.hpp"

#include <algorithm>
#include <cmath>

#include "base/error.hpp"

namespace dsopt {
namespace {
// Status flag carried next to the gradients: 1 per rank with a non-finite
// gradient, kInvalid per rank whose arguments were rejected.
constexpr float kInvalid = StepPipeline::kInvalidStatus;
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

PreparedGrads StepPipeline::prepare(const dsopt_tensor* grads, int64_t count,
                                    const std::vector<uint8_t>& averaged) {
  const int world = comm_.size();
  const std::string local_error = params_.check_grads(grads, count);
  if (world == 1 && !local_error.empty()) fail(DSOPT_EINVAL, "dsopt_step: " + local_error);
  const bool ok = local_error.empty();

  PreparedGrads out;
  const int64_t n = params_.count();
  if (ok) {
    out.grads = caller_grads(grads, count);
  } else {  // sizes from the parameters, so this rank's collectives match the others'
    for (const Param& p : params_.params()) out.grads.push_back(TensorRef{nullptr, p.numel, DType::F32});
  }
  std::vector<TensorRef> avg_refs, local_refs;
  std::vector<int64_t> avg_index;
  for (int64_t i = 0; i < n; ++i) {
    if (world > 1 && averaged[size_t(i)]) {
      avg_refs.push_back(out.grads[size_t(i)]);
      avg_index.push_back(i);
    } else {
      local_refs.push_back(out.grads[size_t(i)]);
    }
  }
  bool nonfinite = false;
  double local_sumsq = 0.0, avg_sumsq = 0.0;

  // Gradients that stay local are checked (and summed) where they lie.
  if (ok && !local_refs.empty() && (cfg_.skip_nonfinite || wants_norm())) {
    std::vector<double> sums(local_refs.size(), 0.0);
    nonfinite = kernels_.transform(local_refs.data(), int64_t(local_refs.size()), 1.0f, nullptr,
                                   wants_norm() ? sums.data() : nullptr).nonfinite;
    for (double s : sums) local_sumsq += s;
  }

  if (!avg_refs.empty()) {
    // Averaged gradients -> one fp32 buffer (checked on the way), the status
    // flag in the element after them; one allreduce carries both.
    int64_t total = 0;
    for (const TensorRef& r : avg_refs) total += r.numel;
    if (!averaged_.get()) averaged_ = DeviceBuffer(kernels_, size_t(params_.total_numel() + 1) * 4);
    float* buf = averaged_.floats();
    float flag = kInvalid;
    if (ok) {
      const bool bad = kernels_.transform(avg_refs.data(), int64_t(avg_refs.size()), 1.0f, buf, nullptr).nonfinite;
      flag = (bad || nonfinite) ? 1.0f : 0.0f;
    }
    kernels_.copy_from_host(buf + total, &flag, 4);
    comm_.allreduce(buf, buf, size_t(total + 1), Elem::F32, ReduceOp::Sum, mem_);
    comm_.wait();  // NCCL: polls for errors and the timeout instead of blocking in the copy
    kernels_.copy_to_host(&flag, buf + total, 4);
    if (flag >= kInvalid) fail_step(local_error);
    nonfinite = flag > 0.0f;
    // a = fl(sum * fl(1/P)), in place; the sums are checked as well.
    const TensorRef whole{buf, total, DType::F32};
    const float inv_world = 1.0f / float(world);
    nonfinite |= kernels_.transform(&whole, 1, inv_world, buf, wants_norm() ? &avg_sumsq : nullptr).nonfinite;
    int64_t offset = 0;
    for (int64_t i : avg_index) {
      const int64_t numel = out.grads[size_t(i)].numel;
      out.grads[size_t(i)] = TensorRef{buf + offset, numel, DType::F32};
      offset += numel;
    }
  }

  // Ranks agree on status and on sqrt(mean_i ||g_i||^2) of the local part
  // through one small allreduce, unless the gradient allreduce said it all.
  if (world > 1 && (avg_refs.empty() || (!local_refs.empty() && wants_norm()))) {
    double control[2] = {ok ? (nonfinite ? 1.0 : 0.0) : double(kInvalid), local_sumsq};
    comm_.allreduce(control, control, 2, Elem::F64, ReduceOp::Sum, Mem{&host_, false});
    if (control[0] >= double(kInvalid)) fail_step(local_error);
    nonfinite |= control[0] > 0.0;
    local_sumsq = control[1] / world;
  }

  out.skip = nonfinite && cfg_.skip_nonfinite;
  set_multipliers(out, avg_sumsq + local_sumsq);
  return out;
}

}  // namespace dsopt
