// The caller's parameters as an optimizer sees them: borrowed buffers, their
// place in dsopt's flat fp32 arrays, and fp32 master copies of 16-bit ones
// (docs/design/decisions.md G7).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dsopt.h"
#include "kernels/device_buffer.hpp"
#include "kernels/kernels.hpp"
#include "state/blob.hpp"

namespace dsopt {

struct Param {
  void* data;      // caller's buffer
  int64_t numel;
  DType dtype;
  int32_t group;
  int64_t offset;  // first element in dsopt's flat per-element arrays
  float* master;   // the fp32 values the update works on (== data for fp32)
};

class ParamSet {
 public:
  // Validates the descriptors (throws Error(DSOPT_EINVAL) naming the
  // parameter) and copies 16-bit parameters into fp32 masters, unless
  // `with_masters` is false (ZeRO keeps the masters of its shard only; then
  // master is nullptr for 16-bit parameters). With `allow_empty` (sharded
  // parameters, dsopt_comm_set_shards) a parameter may have numel 0, and
  // then data NULL.
  ParamSet(const dsopt_tensor* params, int64_t count, int32_t num_groups, Kernels& kernels,
           bool with_masters = true, bool allow_empty = false);

  const std::vector<Param>& params() const { return params_; }
  int64_t count() const { return int64_t(params_.size()); }
  int64_t total_numel() const { return total_numel_; }
  std::vector<BlobParam> shapes() const;

  // fp32 masters of the 16-bit parameters, back to back in parameter order.
  float* masters() const { return masters_.floats(); }
  int64_t master_numel() const { return master_numel_; }
  // A hash of the first and last elements (up to 1 KiB) of every
  // parameter's current values.
  uint64_t fingerprint() const;
  // Points every parameter at new storage (dsopt_rebind_params): `params`
  // must describe the same count, numel, dtype and group, with data on the
  // optimizer's device; else throws Error(DSOPT_EINVAL) naming the
  // parameter, changing nothing. fp32 masters of 16-bit parameters stay;
  // an fp32 parameter's master is its new buffer.
  void rebind(const dsopt_tensor* params, int64_t count);
  // Changes with every rebind(): what caches pointers into the caller's
  // buffers compares it with the value it cached them at.
  uint64_t generation() const { return generation_; }
  // Rounds every master into its 16-bit parameter.
  void write_back();

  // "" when `grads` fit these parameters (count, data, numel, dtype, and
  // memory of the optimizer's device), else what is wrong.
  std::string check_grads(const dsopt_tensor* grads, int64_t count) const;
  // The same for one gradient of parameter `index`, called `who` in the
  // message.
  std::string check_grad(int64_t index, const dsopt_tensor& grad, const std::string& who) const;

 private:
  Kernels& kernels_;
  std::vector<Param> params_;
  int64_t total_numel_ = 0;
  int64_t master_numel_ = 0;
  DeviceBuffer masters_;
  uint64_t generation_ = 0;
  bool allow_empty_ = false;
  // The CUDA device of the optimizer (-1: the CPU); the last gradient
  // address of each parameter found on it (an address is looked up once,
  // not at every step).
  int device_index_ = -1;
  mutable std::vector<const void*> grad_on_device_;

  // Whether `grad` fits parameter `index` (what check_grad checks, without
  // building a message).
  bool fits(size_t index, const dsopt_tensor& grad) const;
  // "" when `data` is memory of the optimizer's device, else " is <where
  // it is> but the optimizer's device is <its device>".
  std::string wrong_device(const void* data) const;
  // Whether gradient `data` of parameter `index` is on the optimizer's device.
  bool grad_on_device(size_t index, const void* data) const;
};

// The first and the last min(bytes, 1 KiB) bytes of `data` (host or
// device memory, as `kernels` reads it), copied to the host.
void sample_ends(Kernels& kernels, const void* data, size_t bytes, std::vector<uint8_t>& first,
                 std::vector<uint8_t>& last);

}  // namespace dsopt
