#include "optim/moments.hpp"

#include "state/section_names.hpp"

namespace dsopt {

Moments::Moments(const ParamSet& params, Kernels& kernels, std::string prefix, int64_t momentum_tail,
                 int count)
    : kernels_(kernels), prefix_(std::move(prefix)), bytes_(size_t(params.total_numel()) * 4),
      count_(count) {
  m_ = DeviceBuffer(kernels_, bytes_ + size_t(momentum_tail) * 4);
  kernels_.fill_zero(m_.get(), m_.bytes());
  if (count_ < 2) return;
  v_ = DeviceBuffer(kernels_, bytes_);
  kernels_.fill_zero(v_.get(), bytes_);
}

Moments::Moments(int64_t numel, Kernels& kernels, std::string prefix, int count)
    : kernels_(kernels), prefix_(std::move(prefix)), bytes_(size_t(numel) * 4), count_(count) {
  m_ = DeviceBuffer(kernels_, bytes_);
  kernels_.fill_zero(m_.get(), bytes_);
  if (count_ < 2) return;
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
    float* v = count_ > 1 ? v_.floats() + p.offset : nullptr;
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
  s.array(exp_avg_section(prefix_), kernels_, [this] { return m_.get(); }, bytes_).view("exp_avg", slice);
  if (count_ > 1)
    s.array(exp_avg_sq_section(prefix_), kernels_, [this] { return v_.get(); }, bytes_)
        .view("exp_avg_sq", slice);
}

}  // namespace dsopt
