#include "params/param_set.hpp"

#include <algorithm>
#include <cstdint>

#include "base/error.hpp"
#include "base/fnv.hpp"
#include "kernels/device_pointer.hpp"

namespace dsopt {
namespace {

// Fails with DSOPT_EINVAL naming two parameters whose storage overlaps (the
// same array twice, or two views of one buffer): each would be updated
// twice per step. `params` passed the per-parameter checks already.
void reject_shared_storage(const dsopt_tensor* params, int64_t count, const char* suffix) {
  struct Span {
    uintptr_t begin, end;
    int64_t index;
  };
  std::vector<Span> spans;
  for (int64_t i = 0; i < count; ++i) {
    if (params[i].numel == 0) continue;  // an empty shard holds no memory
    const uintptr_t begin = reinterpret_cast<uintptr_t>(params[i].data);
    spans.push_back(Span{begin, begin + uintptr_t(params[i].numel) * dtype_size(DType(params[i].dtype)), i});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.index < b.index;
  });
  if (spans.empty()) return;
  Span widest = spans.front();  // the span reaching furthest so far
  for (size_t k = 1; k < spans.size(); ++k) {
    const Span& s = spans[k];
    if (s.begin < widest.end) {
      const int64_t a = std::min(widest.index, s.index), b = std::max(widest.index, s.index);
      fail(DSOPT_EINVAL, "params[" + std::to_string(a) + "] and params[" + std::to_string(b) +
                             "] share storage (their bytes overlap): every parameter needs memory of its "
                             "own, or it would be updated twice per step" + suffix);
    }
    if (s.end > widest.end) widest = s;
  }
}

std::string describe(int64_t numel, int32_t dtype, int32_t group) {
  return "numel " + std::to_string(numel) + ", dtype " +
         (is_valid_dtype(dtype) ? dtype_name(DType(dtype)) : std::to_string(dtype)) + ", group " +
         std::to_string(group);
}

}  // namespace

ParamSet::ParamSet(const dsopt_tensor* params, int64_t count, int32_t num_groups,
                   Kernels& kernels, bool with_masters, bool allow_empty)
    : kernels_(kernels),
      allow_empty_(allow_empty),
      device_index_(kernels.device() == Device::Cuda ? cuda_current_device() : -1) {
  if (count <= 0) fail(DSOPT_EINVAL, "num_params must be > 0, got " + std::to_string(count));
  if (!params) fail(DSOPT_EINVAL, "params is NULL");
  for (int64_t i = 0; i < count; ++i) {
    const dsopt_tensor& t = params[i];
    const std::string who = "params[" + std::to_string(i) + "]";
    const bool empty = allow_empty && t.numel == 0;  // a shard of none of the tensor
    if (!t.data && !empty) fail(DSOPT_EINVAL, who + ".data is NULL");
    if (t.numel <= 0 && !empty)
      fail(DSOPT_EINVAL, who + ".numel must be > 0, got " + std::to_string(t.numel) +
                             (allow_empty ? " (>= 0 for sharded parameters)" : ""));
    if (!is_valid_dtype(t.dtype))
      fail(DSOPT_EINVAL, who + ".dtype " + std::to_string(t.dtype) +
                             " is not a dtype (DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16)");
    if (t.group < 0 || t.group >= num_groups)
      fail(DSOPT_EINVAL, who + ".group " + std::to_string(t.group) + " is out of range: the config has " +
                             std::to_string(num_groups) + " parameter group(s)");
    const std::string where = empty ? "" : wrong_device(t.data);
    if (!where.empty()) fail(DSOPT_EINVAL, who + ".data" + where);
    params_.push_back(Param{t.data, t.numel, DType(t.dtype), t.group, total_numel_, nullptr});
    total_numel_ += t.numel;
    if (with_masters && DType(t.dtype) != DType::F32) master_numel_ += t.numel;
  }
  reject_shared_storage(params, count, "");
  grad_on_device_.assign(params_.size(), nullptr);
  masters_ = DeviceBuffer(kernels_, size_t(master_numel_) * 4);
  int64_t m = 0;
  for (Param& p : params_) {
    if (p.dtype == DType::F32) {
      p.master = static_cast<float*>(p.data);
    } else if (with_masters) {
      p.master = masters_.floats() + m;
      m += p.numel;
      kernels_.to_float(TensorRef{p.data, p.numel, p.dtype}, p.master);
    }
  }
}

std::vector<BlobParam> ParamSet::shapes() const {
  std::vector<BlobParam> s;
  for (const Param& p : params_) s.push_back(BlobParam{p.numel, int32_t(p.dtype), p.group});
  return s;
}

void sample_ends(Kernels& kernels, const void* data, size_t bytes, std::vector<uint8_t>& first,
                 std::vector<uint8_t>& last) {
  const size_t n = std::min<size_t>(bytes, 1024);
  first.resize(n);
  last.resize(n);
  kernels.copy_to_host(first.data(), data, n);
  kernels.copy_to_host(last.data(), static_cast<const uint8_t*>(data) + (bytes - n), n);
}

uint64_t ParamSet::fingerprint() const {
  uint64_t h = kFnvOffset;
  std::vector<uint8_t> first, last;
  for (const Param& p : params_) {
    if (p.numel == 0) continue;  // an empty shard
    sample_ends(kernels_, p.data, size_t(p.numel) * dtype_size(p.dtype), first, last);
    h = fnv1a(first.data(), first.size(), h);
    h = fnv1a(last.data(), last.size(), h);
  }
  return h;
}

void ParamSet::rebind(const dsopt_tensor* params, int64_t count) {
  if (!params) fail(DSOPT_EINVAL, "params is NULL (nothing was changed)");
  if (count != this->count())
    fail(DSOPT_EINVAL, "num_params is " + std::to_string(count) + " but the optimizer has " +
                           std::to_string(this->count()) +
                           " parameters (pass every one; nothing was changed)");
  for (int64_t i = 0; i < count; ++i) {
    const dsopt_tensor& t = params[i];
    const Param& p = params_[size_t(i)];
    const std::string who = "params[" + std::to_string(i) + "]";
    const bool empty = allow_empty_ && p.numel == 0;
    if (!t.data && !empty) fail(DSOPT_EINVAL, who + ".data is NULL (nothing was changed)");
    if (t.numel != p.numel || t.dtype != int32_t(p.dtype) || t.group != p.group)
      fail(DSOPT_EINVAL, who + " has " + describe(t.numel, t.dtype, t.group) +
                             ", the optimizer's parameter " + std::to_string(i) + " has " +
                             describe(p.numel, int32_t(p.dtype), p.group) +
                             " (a rebind changes the storage only; nothing was changed)");
    const std::string where = empty ? "" : wrong_device(t.data);
    if (!where.empty()) fail(DSOPT_EINVAL, who + ".data" + where + " (nothing was changed)");
  }
  reject_shared_storage(params, count, " (nothing was changed)");
  for (int64_t i = 0; i < count; ++i) {
    Param& p = params_[size_t(i)];
    p.data = params[i].data;
    if (p.dtype == DType::F32) p.master = static_cast<float*>(p.data);
  }
  ++generation_;
}

void ParamSet::write_back() {
  for (const Param& p : params_)
    if (p.dtype != DType::F32 && p.master) kernels_.from_float(p.master, p.data, p.dtype, p.numel);
}

std::string ParamSet::check_grads(const dsopt_tensor* grads, int64_t count) const {
  if (!grads) return "grads is NULL";
  if (count != int64_t(params_.size()))
    return "num_grads is " + std::to_string(count) + " but the optimizer has " +
           std::to_string(params_.size()) + " parameters (one gradient per parameter)";
  for (size_t i = 0; i < params_.size(); ++i)
    if (!fits(i, grads[i])) return check_grad(int64_t(i), grads[i], "grads[" + std::to_string(i) + "]");
  return "";
}

bool ParamSet::fits(size_t index, const dsopt_tensor& grad) const {
  return grad.data && grad.numel == params_[index].numel && is_valid_dtype(grad.dtype) &&
         grad_on_device(index, grad.data);
}

std::string ParamSet::wrong_device(const void* data) const {
  const int on = cuda_device_of(data);
  if (on == device_index_) return "";
  const std::string where = on < 0 ? "host memory" : "memory of CUDA device " + std::to_string(on);
  const std::string mine = device_index_ < 0 ? "cpu" : "cuda:" + std::to_string(device_index_);
  return " is " + where + " but the optimizer's device is " + mine;
}

bool ParamSet::grad_on_device(size_t index, const void* data) const {
  if (grad_on_device_[index] == data) return true;
  if (!wrong_device(data).empty()) return false;
  grad_on_device_[index] = data;
  return true;
}

std::string ParamSet::check_grad(int64_t index, const dsopt_tensor& grad, const std::string& who) const {
  if (index < 0 || index >= count())
    return "parameter index " + std::to_string(index) + " is out of range (the optimizer has " +
           std::to_string(count()) + " parameters)";
  if (!grad.data) return who + ".data is NULL";
  if (grad.numel != params_[size_t(index)].numel)
    return who + ".numel is " + std::to_string(grad.numel) + " but params[" +
           std::to_string(index) + "] has " + std::to_string(params_[size_t(index)].numel);
  if (!is_valid_dtype(grad.dtype))
    return who + ".dtype " + std::to_string(grad.dtype) + " is not a dtype";
  if (!grad_on_device(size_t(index), grad.data)) return who + ".data" + wrong_device(grad.data);
  return "";
}

}  // namespace dsopt
