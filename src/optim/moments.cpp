#include "optim/moments.hpp"

#include <string>

#include "base/error.hpp"

namespace dsopt {

Moments::Moments(const ParamSet& params, Kernels& kernels, MomentNames names, int64_t momentum_tail)
    : Moments(params.total_numel(), kernels, std::move(names), momentum_tail) {}

Moments::Moments(int64_t numel, Kernels& kernels, MomentNames names, int64_t momentum_tail)
    : kernels_(kernels), names_(std::move(names)), bytes_(size_t(numel) * 4) {
  if (names_.count() < 1 || names_.count() > 2)
    fail(DSOPT_EINTERNAL, "Moments: one or two moments, got " + std::to_string(names_.count()));
  m_ = DeviceBuffer(kernels_, bytes_ + size_t(momentum_tail) * 4);
  kernels_.fill_zero(m_.get(), m_.bytes());
  if (names_.count() < 2) return;
  v_ = DeviceBuffer(kernels_, bytes_);
  kernels_.fill_zero(v_.get(), bytes_);
}

std::vector<UpdateSlot> Moments::slots(const ParamSet& params, const PreparedGrads* grads,
                                       const std::vector<int64_t>& indices,
                                       const std::vector<const float*>& masks) const {
  const bool all = indices.empty();
  const size_t count = all ? size_t(params.count()) : indices.size();
  std::vector<UpdateSlot> out;
  out.reserve(count);
  for (size_t k = 0; k < count; ++k) {
    const size_t i = all ? k : size_t(indices[k]);
    const Param& p = params.params()[i];
    const TensorRef g = grads ? grads->grads[i] : TensorRef{nullptr, 0, DType::F32};
    float* v = names_.count() > 1 ? v_.floats() + p.offset : nullptr;
    UpdateSlot s = moment_slot(p.master, p.dtype == DType::F32 ? nullptr : p.data, p.dtype, g.data,
                               g.dtype, m_.floats() + p.offset, v, p.numel, p.group);
    if (i < masks.size()) s.set(Operand::Mask, masks[i]);
    out.push_back(s);
  }
  return out;
}

const std::vector<UpdateSlot>& Moments::all_slots(const ParamSet& params,
                                                  const PreparedGrads& grads) {
  if (all_slots_.empty() || all_slots_generation_ != params.generation()) {
    all_slots_ = slots(params, &grads);
    all_slots_generation_ = params.generation();
  }
  for (size_t i = 0; i < all_slots_.size(); ++i) {
    all_slots_[i].set(Operand::Grad, grads.grads[i].data);
    all_slots_[i].grad_dtype = grads.grads[i].dtype;
  }
  return all_slots_;
}

void Moments::describe(StateSchema& s, const StateSchema::Slicer& slice) {
  s.array(names_.section(0), kernels_, [this] { return m_.get(); }, bytes_).view(names_.views[0], slice);
  if (names_.count() > 1)
    s.array(names_.section(1), kernels_, [this] { return v_.get(); }, bytes_)
        .view(names_.views[1], slice);
}

}  // namespace dsopt
