// Views of optimizer state (dsopt_get_state_view, dsopt_state_names): where
// each algorithm keeps a parameter's moments, masters and compression
// errors, as pointers into its own buffers. Nothing is copied: a view shows
// the current state and a write through it is what the next step reads.
#include <string>
#include <vector>

#include "base/error.hpp"
#include "optim/adam.hpp"
#include "optim/onebit_adam.hpp"
#include "optim/onebit_lamb.hpp"
#include "optim/optimizer.hpp"
#include "optim/zero_one_adam.hpp"
#include "optim/zero_adam.hpp"

namespace dsopt {
namespace {

bool on_cuda(const Kernels& k) { return k.device() == Device::Cuda; }

// Parameter p's elements of an array laid out like dsopt's flat
// per-element arrays (parameters back to back, p at Param::offset).
Optimizer::StateView flat_slice(float* base, const Param& p, const Kernels& k) {
  return Optimizer::StateView{base + p.offset, p.numel, 0, on_cuda(k)};
}

// Tensor t's worker error in a CompressedAllreduce over tensors of `sizes`:
// the errors are back to back, each tensor's padded to padded_length, its
// first sizes[t] elements those of the tensor in order.
Optimizer::StateView worker_error_slice(const CompressedAllreduce& car,
                                        const std::vector<int64_t>& sizes, size_t t,
                                        const Kernels& k) {
  int64_t at = 0;
  for (size_t u = 0; u < t; ++u) at += CompressedAllreduce::padded_length(sizes[u], car.world());
  return Optimizer::StateView{car.worker_error() + at, sizes[t], 0, on_cuda(k)};
}

// Why a parameter may lack a state the optimizer has, for the message.
std::string why_absent(const std::string& name) {
  if (name == "master")
    return ": \"master\" is kept for 16-bit parameters only (an fp32 parameter is its own master)";
  if (name == "worker_error")
    return ": the compression error exists only in the 1-bit optimizers at more than one rank, "
           "for parameters whose momentum is compressed (not those of non_freeze groups), and "
           "in 1-bit Adam and 1-bit LAMB from the compression stage on (freeze_step)";
  return "";
}

// This rank's part of parameter `param` under ZeRO: its pieces in the shard,
// merged where they follow each other (in the parameter, the moments and the
// masters), as one run. found is false when the rank holds none of it.
struct ShardRun {
  bool found = false;
  StatePiece piece{};
};

bool follows(const StatePiece& run, const StatePiece& p) {
  const int64_t n = run.numel;
  return p.param_offset == run.param_offset + n && p.state_offset == run.state_offset + n &&
         (p.master_offset < 0 || p.master_offset == run.master_offset + n);
}

ShardRun shard_run(const StateLayout& state, int64_t param, int64_t bucket_elems) {
  std::vector<StatePiece> runs;
  for (const StatePiece& p : state.pieces) {
    if (p.param != param) continue;
    if (!runs.empty() && follows(runs.back(), p))
      runs.back().numel += p.numel;
    else
      runs.push_back(p);
  }
  if (runs.size() > 1)
    fail(DSOPT_EINVAL,
         "parameter " + std::to_string(param) + " spans several reduce buckets (reduce_bucket_size " +
             std::to_string(bucket_elems) + " elements), so this rank's ZeRO shard holds it in " +
             std::to_string(runs.size()) + " separate runs and one view cannot show them; set "
             "\"reduce_bucket_size\" to at least the total numel of the parameters (the default "
             "does) to view its state");
  return runs.empty() ? ShardRun{} : ShardRun{true, runs[0]};
}

}  // namespace

// ---- the base class -----------------------------------------------------------

int64_t Optimizer::param_numel(int64_t param_index, int32_t* group) const {
  if (param_index < 0 || param_index >= params_.count())
    fail(DSOPT_EINVAL, "parameter index " + std::to_string(param_index) +
                           " is out of range (the optimizer has " + std::to_string(params_.count()) +
                           " parameters)");
  const Param& p = params_.params()[size_t(param_index)];
  if (group) *group = p.group;
  return p.numel;
}

Optimizer::StateView Optimizer::state_view(int64_t param_index, const std::string& name) {
  require_intact("dsopt_get_state_view");
  param_numel(param_index, nullptr);  // range check
  const AlgorithmView v = name == "master" ? master_view(param_index) : algorithm_view(param_index, name);
  if (!v.found)
    fail(DSOPT_EINVAL, "parameter " + std::to_string(param_index) + " has no state \"" + name + "\"" +
                           why_absent(name) + "; the state names of this " + algorithm() +
                           " optimizer are: " + state_names());
  return v.view;
}

const std::string& Optimizer::state_names() const {
  if (state_names_.empty()) {
    state_names_ = algorithm_state_names();
    for (const Param& p : params_.params())
      if (p.dtype != DType::F32) {
        state_names_ += " master";
        break;
      }
  }
  return state_names_;
}

Optimizer::AlgorithmView Optimizer::master_view(int64_t param_index) {
  const Param& p = params_.params()[size_t(param_index)];
  if (p.dtype == DType::F32 || !p.master) return {};
  return {true, StateView{p.master, p.numel, 0, on_cuda(*kernels_)}};
}

// ---- Adam/AdamW without ZeRO: moments over all parameters ------------------------

std::string Adam::algorithm_state_names() const { return "exp_avg exp_avg_sq"; }

Optimizer::AlgorithmView Adam::algorithm_view(int64_t i, const std::string& name) {
  const Param& p = params().params()[size_t(i)];
  if (name == "exp_avg") return {true, flat_slice(moments_.exp_avg(), p, kernels())};
  if (name == "exp_avg_sq") return {true, flat_slice(moments_.exp_avg_sq(), p, kernels())};
  return {};
}

// ---- ZeRO stage 1 and 2: this rank's shard ------------------------------------------

std::string ZeroAdam::algorithm_state_names() const { return "exp_avg exp_avg_sq"; }

Optimizer::AlgorithmView ZeroAdam::algorithm_view(int64_t i, const std::string& name) {
  float* base = nullptr;
  if (name == "exp_avg") base = moments_.exp_avg();
  if (name == "exp_avg_sq") base = moments_.exp_avg_sq();
  if (!base) return {};
  const ShardRun run = shard_run(state_, i, layout_.bucket_elems());
  StateView v;
  v.on_device = on_cuda(state_kernels());
  if (run.found) {
    v.data = base + run.piece.state_offset;
    v.numel = run.piece.numel;
    v.offset = run.piece.param_offset;
  }
  return {true, v};
}

Optimizer::AlgorithmView ZeroAdam::master_view(int64_t i) {
  if (params().params()[size_t(i)].dtype == DType::F32) return {};
  const ShardRun run = shard_run(state_, i, layout_.bucket_elems());
  StateView v;
  v.on_device = on_cuda(state_kernels());
  if (run.found) {
    v.data = masters_.floats() + run.piece.master_offset;
    v.numel = run.piece.numel;
    v.offset = run.piece.param_offset;
  }
  return {true, v};
}

// ---- 1-bit Adam ------------------------------------------------------------------------

std::string OneBitAdam::algorithm_state_names() const {
  const bool errors = comm().size() > 1 && !compressed_.empty();
  return errors ? "exp_avg exp_avg_sq worker_error" : "exp_avg exp_avg_sq";
}

Optimizer::AlgorithmView OneBitAdam::algorithm_view(int64_t i, const std::string& name) {
  const Param& p = params().params()[size_t(i)];
  if (name == "exp_avg") return {true, flat_slice(moments_.exp_avg(), p, kernels())};
  if (name == "exp_avg_sq") return {true, flat_slice(moments_.exp_avg_sq(), p, kernels())};
  if (name != "worker_error" || !car_) return {};
  // The compressed allreduce runs over the compressed parameters, in order.
  std::vector<int64_t> sizes;
  size_t t = compressed_.size();
  for (size_t k = 0; k < compressed_.size(); ++k) {
    if (compressed_[k] == i) t = k;
    sizes.push_back(params().params()[size_t(compressed_[k])].numel);
  }
  if (t == compressed_.size()) return {};  // a non_freeze parameter
  return {true, worker_error_slice(*car_, sizes, t, kernels())};
}

// ---- 1-bit LAMB: every array over all parameters (the momentum fused) ---------------

std::string OneBitLamb::algorithm_state_names() const {
  return comm().size() > 1 ? "exp_avg exp_avg_sq exp_avg_sq_fresh worker_error"
                           : "exp_avg exp_avg_sq exp_avg_sq_fresh";
}

Optimizer::AlgorithmView OneBitLamb::algorithm_view(int64_t i, const std::string& name) {
  const Param& p = params().params()[size_t(i)];
  if (name == "exp_avg") return {true, flat_slice(moments_.exp_avg(), p, kernels())};
  if (name == "exp_avg_sq") return {true, flat_slice(moments_.exp_avg_sq(), p, kernels())};
  if (name == "exp_avg_sq_fresh") return {true, flat_slice(fresh_.floats(), p, kernels())};
  // One compressed tensor: the fused momentum, parameters at their offsets.
  if (name == "worker_error" && car_) return {true, flat_slice(car_->worker_error(), p, kernels())};
  return {};
}

// ---- 0/1 Adam --------------------------------------------------------------------------

std::string ZeroOneAdam::algorithm_state_names() const {
  return car_ ? "exp_avg exp_avg_sq worker_error" : "exp_avg exp_avg_sq";
}

Optimizer::AlgorithmView ZeroOneAdam::algorithm_view(int64_t i, const std::string& name) {
  const Param& p = params().params()[size_t(i)];
  if (name == "exp_avg") return {true, flat_slice(moments_.exp_avg(), p, kernels())};
  if (name == "exp_avg_sq") return {true, flat_slice(moments_.exp_avg_sq(), p, kernels())};
  if (name != "worker_error" || !car_) return {};
  // The compressed allreduce runs over every parameter, in order.
  std::vector<int64_t> sizes;
  for (const Param& q : params().params()) sizes.push_back(q.numel);
  return {true, worker_error_slice(*car_, sizes, size_t(i), kernels())};
}

}  // namespace dsopt
