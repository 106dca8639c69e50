// Views of optimizer state (dsopt_get_state_view, dsopt_state_names): where
// each algorithm keeps a parameter's moments, masters and compression
// errors, as pointers into its own buffers, from the views its state list
// declares (describe_state). Nothing is copied: a view shows the current
// state and a write through it is what the next step reads.
#include <string>
#include <vector>

#include "base/error.hpp"
#include "facade/optimizer.hpp"
#include "facade/optimizer_impl.hpp"

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

int64_t Optimizer::param_numel(int64_t param_index, int32_t* group) const {
  const ParamSet& params = impl_->parts.params();
  if (param_index < 0 || param_index >= params.count())
    fail(DSOPT_EINVAL, "parameter index " + std::to_string(param_index) +
                           " is out of range (the optimizer has " + std::to_string(params.count()) +
                           " parameters)");
  const Param& p = params.params()[size_t(param_index)];
  if (group) *group = p.group;
  return p.numel;
}

Optimizer::StateView Optimizer::state_view(int64_t param_index, const std::string& name) {
  const Impl& s = *impl_;
  s.require_intact("dsopt_get_state_view");
  param_numel(param_index, nullptr);  // range check
  StateSchema::View v = s.state_schema().view(name, param_index);
  if (!v.slice.found && name == "master") {  // the parameter set's masters
    const Param& p = s.parts.params().params()[size_t(param_index)];
    if (p.dtype != DType::F32 && p.master)
      v = {{true, p.master, p.numel, 0}, s.parts.kernels().device() == Device::Cuda};
  }
  if (!v.slice.found)
    fail(DSOPT_EINVAL, "parameter " + std::to_string(param_index) + " has no state \"" + name + "\"" +
                           why_absent(name) + "; the state names of this " + s.algorithm->blob_name() +
                           " optimizer are: " + state_names());
  return StateView{v.slice.data, v.slice.numel, v.slice.offset, v.on_device};
}

const std::string& Optimizer::state_names() const {
  const Impl& s = *impl_;
  if (s.state_names.empty()) {
    s.state_names = s.state_schema().view_names();
    for (const Param& p : s.parts.params().params())
      if (p.dtype != DType::F32) {
        s.state_names += " master";
        break;
      }
  }
  return s.state_names;
}

}  // namespace dsopt
