#include "algorithms/moment_rules/offloaded_update.hpp"

#include <algorithm>

namespace dsopt {

OffloadedUpdate::OffloadedUpdate(const StateLayout& state, const ParamSet& params, Kernels& device,
                                 Kernels& host, bool pin, int64_t tile, float* masters16, float* m,
                                 float* v, UpdateRule rule)
    : state_(state), params_(params), device_(device), host_(host), pin_(pin), tile_(tile),
      masters16_(masters16), m_(m), v_(v), rule_(rule) {
  int64_t fp32 = 0;
  bool any_half = false;
  for (const StatePiece& p : state_.pieces) {
    const bool half = params_.params()[size_t(p.param)].dtype != DType::F32;
    fp32_offset_.push_back(half ? -1 : fp32);
    if (!half) fp32 += p.numel;
    any_half |= half;
  }
  fp32_masters_ = DeviceBuffer(host_, size_t(fp32) * 4);
  grads_ = DeviceBuffer(host_, size_t(state_.state_numel) * 4);
  if (any_half) staging_ = DeviceBuffer(host_, size_t(2 * tile_) * 2);
  if (pin_) {
    const std::pair<void*, size_t> regions[] = {
        {masters16_, size_t(state_.master_numel) * 4},
        {m_, size_t(state_.state_numel) * 4},
        {v_, size_t(state_.state_numel) * 4},
        {fp32_masters_.get(), fp32_masters_.bytes()},
        {grads_.get(), grads_.bytes()},
        {staging_.get(), staging_.bytes()}};
    for (const auto& r : regions) {
      if (!r.first || r.second == 0) continue;
      device_.pin(r.first, r.second);
      pinned_.push_back(r.first);
    }
  }
}

OffloadedUpdate::~OffloadedUpdate() {
  device_.wait_lane(0);
  device_.wait_lane(1);
  for (void* p : pinned_) device_.unpin(p);
}

float* OffloadedUpdate::master(const StatePiece& p) const {
  const size_t i = size_t(&p - state_.pieces.data());
  return p.master_offset >= 0 ? masters16_ + p.master_offset
                              : fp32_masters_.floats() + fp32_offset_[i];
}

void OffloadedUpdate::read_masters(bool half_too) {
  std::vector<uint8_t> bytes;
  for (const StatePiece& p : state_.pieces) {
    const Param& param = params_.params()[size_t(p.param)];
    if (param.dtype != DType::F32 && !half_too) continue;
    const size_t size = dtype_size(param.dtype);
    bytes.resize(size_t(p.numel) * size);
    device_.copy_to_host(bytes.data(), static_cast<const uint8_t*>(param.data) + p.param_offset * int64_t(size),
                         bytes.size());
    host_.to_float(TensorRef{bytes.data(), p.numel, param.dtype}, master(p));
  }
}

void OffloadedUpdate::upload(const StatePiece& p, int64_t from, int64_t n, const void* src, int lane) {
  const Param& param = params_.params()[size_t(p.param)];
  const size_t size = dtype_size(param.dtype);
  device_.copy_from_host_async(static_cast<uint8_t*>(param.data) + (p.param_offset + from) * int64_t(size),
                               src, size_t(n) * size, lane);
}

void OffloadedUpdate::run(const float* shard_grads, const AdamStepConsts& c, float mul1,
                          float mul2) {
  device_.copy_to_host(grads_.get(), shard_grads, grads_.bytes());
  // A fp32 master uploads itself; it is not written again this step.
  const int64_t shard = state_.state_numel;
  std::vector<UpdateSlot> slots;
  for (int64_t begin = 0, tile = 0; begin < shard; begin += tile_, ++tile) {
    const int64_t end = std::min(shard, begin + tile_);
    const int lane = int(tile & 1);
    device_.wait_lane(lane);  // this lane's staging was uploaded two tiles ago
    auto* staging = static_cast<uint8_t*>(staging_.get()) + size_t(lane) * size_t(tile_) * 2;
    slots.clear();
    struct Cut { const StatePiece* p; int64_t from, n, tile_offset; };
    std::vector<Cut> cuts;
    for (const StatePiece& p : state_.pieces) {
      const int64_t lo = std::max(begin, p.state_offset), hi = std::min(end, p.state_offset + p.numel);
      if (lo >= hi) continue;
      const int64_t from = lo - p.state_offset, n = hi - lo;
      const Param& param = params_.params()[size_t(p.param)];
      const int32_t consts = c.index(p.param, param.group);
      if (consts < 0) continue;  // not updated this step: nothing to upload
      const bool half = param.dtype != DType::F32;
      slots.push_back(moment_slot(master(p) + from, half ? staging + (lo - begin) * 2 : nullptr,
                                  param.dtype, grads_.floats() + lo, DType::F32, m_ + lo, v_ ? v_ + lo : nullptr,
                                  n, consts));
      cuts.push_back(Cut{&p, from, n, lo - begin});
    }
    host_.update(rule_, slots.data(), int64_t(slots.size()), c.consts.data(),
                 int32_t(c.consts.size()), mul1, mul2);
    for (const Cut& c : cuts) {
      const bool half = params_.params()[size_t(c.p->param)].dtype != DType::F32;
      upload(*c.p, c.from, c.n, half ? static_cast<const void*>(staging + c.tile_offset * 2)
                                     : static_cast<const void*>(master(*c.p) + c.from), lane);
    }
  }
  device_.wait_lane(0);
  device_.wait_lane(1);
}

void OffloadedUpdate::publish() {
  std::vector<uint16_t> rounded;
  for (const StatePiece& p : state_.pieces) {
    const Param& param = params_.params()[size_t(p.param)];
    if (param.dtype == DType::F32) continue;
    rounded.resize(size_t(p.numel));
    host_.from_float(master(p), rounded.data(), param.dtype, p.numel);
    upload(p, 0, p.numel, rounded.data(), 0);
    device_.wait_lane(0);
  }
}

}  // namespace dsopt
