#include "handover/packed_allreduce.hpp"

#include <algorithm>

namespace dsopt {

PackedAllreduce::PackedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem, CommRunner& runner,
                                 const ParamSet& params, int64_t bucket_elems)
    : GradientHandover(kernels), comm_(comm), mem_(mem), runner_(runner), params_(params),
      bucket_elems_(std::max<int64_t>(1, bucket_elems)) {}

GradientHandover::Plan PackedAllreduce::plan(const std::vector<uint8_t>& averaged) const {
  const size_t n = params_.params().size();
  Plan p;
  p.pos.assign(n, 0);
  p.numel.assign(n, 0);
  p.bucketed.assign(n, 0);
  const bool reduce = comm_.size() > 1;
  int64_t at = 1;  // position 0: the status slot
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < n; ++i) {
      const bool bucketed = reduce && averaged[i];
      if (bucketed != (pass == 0)) continue;
      p.pos[i] = at;
      p.numel[i] = params_.params()[i].numel;
      p.bucketed[i] = bucketed ? 1 : 0;
      at += p.numel[i];
    }
    if (pass == 0 && at > 1)
      for (int64_t end = 0; end < at;) p.bucket_ends.push_back(end = std::min(at, end + bucket_elems_));
  }
  return p;
}

float* PackedAllreduce::storage(int64_t, int64_t pos) {
  if (!buffer_.get()) buffer_ = DeviceBuffer(kernels_, size_t(params_.total_numel() + 1) * 4);
  return buffer_.floats() + pos;
}

void PackedAllreduce::reduce(int64_t k, int) {
  const int64_t begin = k == 0 ? 0 : plan_in_use().bucket_ends[size_t(k - 1)];
  const int64_t end = plan_in_use().bucket_ends[size_t(k)];
  float* buf = storage(k, 0);
  if (k == 0) {
    const float status = status_base_ >= 1.0f ? status_base_ : (nonfinite() ? 1.0f : 0.0f);
    kernels_.copy_from_host(buf, &status, 4);
  }
  runner_.post([this, buf, begin, end] {
    comm_.allreduce(buf + begin, buf + begin, size_t(end - begin), Elem::F32, ReduceOp::Sum, mem_);
    comm_.wait();  // NCCL: polls for errors and the timeout instead of blocking in the copy
  });
}

}  // namespace dsopt
