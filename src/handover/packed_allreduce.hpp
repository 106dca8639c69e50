// Stage 0's reduction of the averaged gradients (docs/design/decisions.md G3): one fp32
// packing of a status slot and the averaged parameters' gradients in
// parameter order, cut into reduce buckets of "reduce_bucket_size" elements,
// each allreduced in place; the parameters whose gradients stay local (1-bit
// compression stages) are packed after them when handed over. The status
// slot is packing position 0, in the bucket reduced last.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "handover/gradient_handover.hpp"
#include "kernels/device_buffer.hpp"
#include "params/param_set.hpp"

namespace dsopt {

class PackedAllreduce final : public GradientHandover {
 public:
  PackedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem, CommRunner& runner,
                  const ParamSet& params, int64_t bucket_elems);

  // averaged[i]: whether parameter i's gradient is averaged over ranks.
  Plan plan(const std::vector<uint8_t>& averaged) const;
  // The status value reduced with the last bucket, read when it starts.
  void set_status(float base) { status_base_ = base; }
  float* data() const { return buffer_.floats(); }

 protected:
  float* storage(int64_t k, int64_t pos) override;
  bool fresh(int m) const override { return m == 0; }
  bool reduces(int m) const override { return m + 1 == micro_batches(); }
  void reduce(int64_t k, int m) override;

 private:
  Comm& comm_;
  Mem mem_;
  CommRunner& runner_;
  const ParamSet& params_;
  int64_t bucket_elems_;
  float status_base_ = 0.0f;
  DeviceBuffer buffer_;  // status slot + every parameter's gradient
};

}  // namespace dsopt
