// Owning handle for memory allocated through a Kernels object.
#pragma once
#include <cstddef>
#include <utility>

#include "kernels/kernels.hpp"

namespace dsopt {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Kernels& k, size_t bytes) : k_(&k), p_(k.alloc(bytes)), bytes_(bytes) {
    k.buffer_bytes_ += bytes;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(k_, o.k_);
      std::swap(p_, o.p_);
      std::swap(bytes_, o.bytes_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return p_; }
  float* floats() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void reset() {
    if (p_) k_->release(p_);
    if (k_) k_->buffer_bytes_ -= bytes_;
    p_ = nullptr;
    bytes_ = 0;
  }
  Kernels* k_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dsopt
