#include "comm/compressed_allreduce.hpp"

#include <cmath>
#include <numeric>

#include "base/error.hpp"

namespace dsopt {
namespace {

// DECISIONS C3: s = fl(fl(sqrt(sum_sq)) / fl(sqrt(double(len)))).
float rms_scale(double sum_squares, int64_t len) {
  return float(std::sqrt(sum_squares)) / float(std::sqrt(double(len)));
}

}  // namespace

int64_t CompressedAllreduce::padded_length(int64_t n, int world) {
  const int64_t divider = int64_t(8) * world / std::gcd(int64_t(world), int64_t(8));
  const int64_t unit = int64_t(world) * divider;
  return n % unit == 0 ? n : n + unit - n % unit;
}

CompressedAllreduce::CompressedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem,
                                         std::vector<int64_t> sizes)
    : comm_(comm), kernels_(kernels), mem_(mem), host_(make_cpu_kernels(1)), world_(comm.size()) {
  int64_t offset = 0;
  for (int64_t n : sizes) {
    const int64_t padded = padded_length(n, world_);
    tensors_.push_back(CarTensor{nullptr, n, padded, nullptr, nullptr, offset});
    offset += padded / world_ / 8;
    worker_numel_ += padded;
  }
  msg_bytes_ = offset;
  worker_error_ = DeviceBuffer(kernels_, size_t(worker_numel_) * 4);
  server_error_ = DeviceBuffer(kernels_, size_t(worker_numel_ / world_) * 4);
  int64_t w = 0;
  for (CarTensor& t : tensors_) {
    t.worker_error = worker_error_.floats() + w;
    t.server_error = server_error_.floats() + w / world_;
    w += t.padded;
  }
  reset_errors();
  if (world_ > 1) {
    send_ = DeviceBuffer(kernels_, size_t(msg_bytes_) * size_t(world_));
    recv_ = DeviceBuffer(kernels_, size_t(msg_bytes_) * size_t(world_));
    server_bits_ = DeviceBuffer(kernels_, size_t(msg_bytes_));
  }
}

void CompressedAllreduce::reset_errors() {
  kernels_.fill_zero(worker_error_.get(), worker_error_.bytes());
  kernels_.fill_zero(server_error_.get(), server_error_.bytes());
}

void CompressedAllreduce::run(float* const* x) {
  if (world_ == 1) return;  // C5: identity
  const int64_t T = count();
  for (int64_t t = 0; t < T; ++t) tensors_[t].x = x[t];
  const Mem host{host_.get(), false};
  auto* send = static_cast<uint8_t*>(send_.get());
  auto* recv = static_cast<uint8_t*>(recv_.get());
  auto* server_bits = static_cast<uint8_t*>(server_bits_.get());
  const size_t tensors = tensors_.size();
  std::vector<double> sumsq(tensors);
  std::vector<float> scales(tensors), all_scales(tensors * size_t(world_));

  // Worker: compress y = x + e_w; phase 1: signs to their chunk's owner.
  kernels_.car_worker_sumsq(tensors_.data(), T, sumsq.data());
  for (int64_t t = 0; t < T; ++t) scales[t] = rms_scale(sumsq[t], tensors_[t].padded);
  kernels_.car_worker_pack(tensors_.data(), T, world_, scales.data(), send, msg_bytes_);
  comm_.alltoall(send, recv, size_t(msg_bytes_), Elem::U8, mem_);
  comm_.allgather(scales.data(), all_scales.data(), size_t(T), Elem::F32, host);

  // Server: average this rank's chunk (C4), add e_s, recompress.
  const float inv_world = 1.0f / float(world_);
  std::vector<float> weights(all_scales.size());
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = all_scales[i] * inv_world;
  kernels_.car_server_sum(tensors_.data(), T, world_, recv, msg_bytes_, weights.data(), sumsq.data());
  for (int64_t t = 0; t < T; ++t) scales[t] = rms_scale(sumsq[t], tensors_[t].padded / world_);
  kernels_.car_server_pack(tensors_.data(), T, world_, scales.data(), server_bits);

  // Phase 2: every chunk to everyone, then decode into x.
  comm_.allgather(server_bits, send, size_t(msg_bytes_), Elem::U8, mem_);
  comm_.allgather(scales.data(), all_scales.data(), size_t(T), Elem::F32, host);
  kernels_.car_decode(tensors_.data(), T, world_, send, msg_bytes_, all_scales.data());
}

}  // namespace dsopt
