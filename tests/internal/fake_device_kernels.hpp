// Host memory posing as device memory for tests of the internals: a
// Kernels object that reports Device::Cuda, runs the CPU kernels and counts
// the host transfers, pins and asynchronous uploads made through it.
#pragma once
#include <memory>

#include "kernels/kernels.hpp"

namespace dsopt {

class FakeDeviceKernels : public Kernels {
 public:
  FakeDeviceKernels() : cpu_(make_cpu_kernels(1)) {}
  Device device() const override { return Device::Cuda; }
  const char* name() const override { return "fake-device"; }
  void* alloc(size_t b) override { return cpu_->alloc(b); }
  void release(void* p) override { cpu_->release(p); }
  void* host_staging(size_t b) override { ++staging_allocs; return cpu_->host_staging(b); }
  void copy(void* d, const void* s, size_t b) override { cpu_->copy(d, s, b); }
  void copy_to_host(void* d, const void* s, size_t b) override { ++to_host; cpu_->copy(d, s, b); }
  void copy_from_host(void* d, const void* s, size_t b) override { ++from_host; cpu_->copy(d, s, b); }
  void fill_zero(void* d, size_t b) override { cpu_->fill_zero(d, b); }
  void synchronize() override {}
  void to_float(const TensorRef& s, float* d) override { cpu_->to_float(s, d); }
  void from_float(const float* s, void* d, DType t, int64_t n) override { cpu_->from_float(s, d, t, n); }
  GradStats transform(const TensorRef* s, int64_t c, float m, float* d, double* q) override {
    return cpu_->transform(s, c, m, d, q);
  }
  GradStats accumulate(const TensorRef* s, int64_t c, float* d) override { return cpu_->accumulate(s, c, d); }
  void update_records(UpdateRule r, const UpdateSlot* s, int64_t c, const void* k, int32_t g,
                      float a, float b) override {
    cpu_->update_records(r, s, c, k, g, a, b);
  }
  void max_per_tensor(const TensorRef* s, int64_t c, float* o) override { cpu_->max_per_tensor(s, c, o); }
  void codec_encode(BlockCodec c, int64_t b, const float* g, const uint8_t* e, float m, uint8_t* r,
                    int64_t n, int runs, uint8_t* o) override {
    cpu_->codec_encode(c, b, g, e, m, r, n, runs, o);
  }
  void codec_decode_sum(BlockCodec c, int64_t b, const uint8_t* in, int runs, int64_t n, float* d) override {
    cpu_->codec_decode_sum(c, b, in, runs, n, d);
  }
  void car_worker_sumsq(const CarTensor* t, int64_t c, double* q) override { cpu_->car_worker_sumsq(t, c, q); }
  void car_worker_pack(const CarTensor* t, int64_t c, int w, const float* s, uint8_t* o, int64_t m) override {
    cpu_->car_worker_pack(t, c, w, s, o, m);
  }
  void car_server_sum(const CarTensor* t, int64_t c, int w, const uint8_t* r, int64_t m, const float* s,
                      double* q) override {
    cpu_->car_server_sum(t, c, w, r, m, s, q);
  }
  void car_server_pack(const CarTensor* t, int64_t c, int w, const float* s, uint8_t* o) override {
    cpu_->car_server_pack(t, c, w, s, o);
  }
  void car_decode(const CarTensor* t, int64_t c, int w, const uint8_t* g, int64_t m, const float* s) override {
    cpu_->car_decode(t, c, w, g, m, s);
  }
  void pin(void* p, size_t b) override { ++pins; ++pinned_now(); cpu_->pin(p, b); }
  void unpin(void* p) override { ++unpins; --pinned_now(); cpu_->unpin(p); }
  // Regions pinned and not yet unpinned, over every object (it outlives them).
  static int& pinned_now() {
    static int n = 0;
    return n;
  }
  void copy_from_host_async(void* d, const void* s, size_t b, int lane) override {
    ++async_uploads[lane & 1];
    cpu_->copy(d, s, b);
  }
  int staging_allocs = 0, to_host = 0, from_host = 0, pins = 0, unpins = 0;
  int async_uploads[2] = {0, 0};

 private:
  std::unique_ptr<Kernels> cpu_;
};


}  // namespace dsopt
