// Views of optimizer state (dsopt_get_state_view, dsopt_state_names): where
// each algorithm keeps a parameter's moments, masters and compression
// errors, as pointers into its own buffers, from the views its state list
// declares (describe_state). Nothing is copied: a view shows the current
// state and a write through it is what the next step reads.
#include <string>
#include <vector>

#include "base/error.hpp"
#include "optim/optimizer.hpp"

namespace dsopt {
namespace {

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
  StateSchema::View v = state_schema().view(name, param_index);
  if (!v.slice.found && name == "master") {  // the parameter set's masters
    const Param& p = params_.params()[size_t(param_index)];
    if (p.dtype != DType::F32 && p.master)
      v = {{true, p.master, p.numel, 0}, kernels_->device() == Device::Cuda};
  }
  if (!v.slice.found)
    fail(DSOPT_EINVAL, "parameter " + std::to_string(param_index) + " has no state \"" + name + "\"" +
                           why_absent(name) + "; the state names of this " + algorithm() +
                           " optimizer are: " + state_names());
  return StateView{v.slice.data, v.slice.numel, v.slice.offset, v.on_device};
}

const std::string& Optimizer::state_names() const {
  if (state_names_.empty()) {
    state_names_ = state_schema().view_names();
    for (const Param& p : params_.params())
      if (p.dtype != DType::F32) {
        state_names_ += " master";
        break;
      }
  }
  return state_names_;
}

StateSchema::Slicer Optimizer::flat_slices() const {
  return [this](int64_t i, float* array) {
    const Param& p = params_.params()[size_t(i)];
    return StateSchema::Slice{true, array + p.offset, p.numel, 0};
  };
}

}  // namespace dsopt
