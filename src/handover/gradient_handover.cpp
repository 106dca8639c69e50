#include "handover/gradient_handover.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace dsopt {

void GradientHandover::open(Plan plan, int micro_batches) {
  plan_ = std::move(plan);
  const size_t n = plan_.pos.size(), buckets = plan_.bucket_ends.size();
  runs_.assign(n, {});
  bucket_elems_.assign(buckets, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t begin = plan_.pos[i], end = begin + plan_.numel[i];
    if (!plan_.bucketed[i]) {
      runs_[i].push_back(Run{-1, 0, begin, plan_.numel[i]});
      continue;
    }
    // First bucket whose end is past `begin`.
    size_t k = size_t(std::upper_bound(plan_.bucket_ends.begin(), plan_.bucket_ends.end(), begin) -
                      plan_.bucket_ends.begin());
    for (int64_t at = begin; at < end; ++k) {
      const int64_t stop = std::min(end, plan_.bucket_ends[k]);
      runs_[i].push_back(Run{int64_t(k), at - begin, at, stop - at});
      bucket_elems_[k] += stop - at;
      at = stop;
    }
  }
  count_.assign(n, 0);
  received_.assign(n, 0);
  micro_batches_ = std::max(1, micro_batches);
  micro_ = 0;
  nonfinite_ = false;
  open_ = true;
  start_micro_batch();
}

void GradientHandover::start_micro_batch() {
  bucket_left_ = bucket_elems_;
  missing_ = int64_t(plan_.pos.size());
  next_reduce_ = int64_t(plan_.bucket_ends.size()) - 1;
  reduce_ready();  // buckets holding no parameter element
}

void GradientHandover::hand_over(int64_t i, const TensorRef& grad) {
  if (count_[size_t(i)] >= micro_batches_)
    fail(DSOPT_EINVAL, "parameter " + std::to_string(i) + " was already handed over " +
                           std::to_string(micro_batches_) +
                           " times in this step (gradient_accumulation_steps); call dsopt_step");
  if (count_[size_t(i)] > micro_) {  // its second gradient: the next micro-batch starts
    close_micro_batch();
    ++micro_;
    start_micro_batch();
  }
  write(i, &grad);
  if (missing_ == 0 && micro_ + 1 < micro_batches_) {
    ++micro_;
    start_micro_batch();
  }
}

void GradientHandover::hand_over_bucketed(const TensorRef* grads) {
  std::vector<std::vector<TensorRef>> parts(plan_.bucket_ends.size());
  std::vector<int64_t> first(plan_.bucket_ends.size(), -1);
  for (size_t i = 0; i < runs_.size(); ++i) {
    for (const Run& r : runs_[i]) {
      if (r.bucket < 0) continue;
      const auto* base = static_cast<const uint8_t*>(grads[i].data);
      parts[size_t(r.bucket)].push_back(TensorRef{
          base + r.param_offset * int64_t(dtype_size(grads[i].dtype)), r.numel, grads[i].dtype});
      if (first[size_t(r.bucket)] < 0) first[size_t(r.bucket)] = r.pos;
    }
    ++count_[i];
    received_[i] = 1;
  }
  missing_ = 0;
  // Parameters are packed back to back, so a bucket's parts are contiguous.
  for (int64_t k = int64_t(parts.size()) - 1; k >= 0; --k) {
    const std::vector<TensorRef>& p = parts[size_t(k)];
    if (!p.empty())
      nonfinite_ |= kernels_.transform(p.data(), int64_t(p.size()), 1.0f,
                                       storage(k, first[size_t(k)]), nullptr).nonfinite;
    bucket_left_[size_t(k)] = 0;
    reduce_ready();
  }
}

void GradientHandover::complete() {
  for (;;) {
    close_micro_batch();
    if (micro_ + 1 >= micro_batches_) return;
    ++micro_;
    start_micro_batch();
  }
}

void GradientHandover::close_micro_batch() {
  for (size_t i = 0; i < count_.size(); ++i)
    if (count_[i] == micro_) write(int64_t(i), nullptr);
}

void GradientHandover::write(int64_t i, const TensorRef* grad) {
  const bool overwrite = fresh(micro_);
  for (const Run& r : runs_[size_t(i)]) {
    float* dst = storage(r.bucket, r.pos);
    if (!grad) {
      if (overwrite) kernels_.fill_zero(dst, size_t(r.numel) * 4);
    } else {
      received_[size_t(i)] = 1;
      const auto* base = static_cast<const uint8_t*>(grad->data);
      const TensorRef part{base + r.param_offset * int64_t(dtype_size(grad->dtype)), r.numel,
                           grad->dtype};
      const GradStats st = overwrite ? kernels_.transform(&part, 1, 1.0f, dst, nullptr)
                                     : kernels_.accumulate(&part, 1, dst);
      nonfinite_ |= st.nonfinite;
    }
    if (r.bucket >= 0) bucket_left_[size_t(r.bucket)] -= r.numel;
  }
  ++count_[size_t(i)];
  --missing_;
  reduce_ready();
}

void GradientHandover::reduce_ready() {
  if (!reduces(micro_)) return;
  while (next_reduce_ >= 0 && bucket_left_[size_t(next_reduce_)] == 0) {
    reduce(next_reduce_, micro_);
    --next_reduce_;
  }
}

}  // namespace dsopt
