// The per-device kernel interface. Optimizers and the step pipeline are
// written once against it; "device": "cpu" gives CpuKernels
// (src/kernels/cpu), "cuda" gives CudaKernels (cuda/). Tensor data passed
// to a Kernels method lives in that device's memory unless the name says
// "host"; the descriptor arrays (UpdateSlot, a rule's constants, TensorRef
// lists) are host memory.
//
// Ordering: methods that return data to the host (copy_to_host, transform)
// or read host memory (copy_from_host) finish before returning; the others
// may only queue work, in order, on the device's stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "base/dtype.hpp"
#include "base/error.hpp"
#include "math/adam.hpp"
#include "math/block_codec.hpp"
#include "math/update_rules.hpp"

namespace dsopt {

enum class Device { Cpu, Cuda };

// A read-only view of a caller's tensor.
struct TensorRef {
  const void* data;
  int64_t numel;
  DType dtype;
};

// What a pass over gradients found.
struct GradStats {
  bool nonfinite = false;  // some value was Inf or NaN
};

// Which elementwise rule Kernels::update applies: one per line of
// math/update_rules.hpp, each declared by its functor in its math header
// (math/adam.hpp, math/onebit_adam.hpp, math/onebit_lamb.hpp,
// math/zero_one_adam.hpp), which says what it reads and writes.
enum class UpdateRule : int32_t {
#define DSOPT_RULE_ENUMERATOR(name, functor) name,
  DSOPT_UPDATE_RULES(DSOPT_RULE_ENUMERATOR)
#undef DSOPT_RULE_ENUMERATOR
};

DSOPT_ISA_BEGIN
// The bytes of one record of `rule`'s constants (its functor's Consts).
inline size_t rule_consts_bytes(UpdateRule rule) {
  switch (rule) {
#define DSOPT_RULE_CONSTS_BYTES(name, functor) \
  case UpdateRule::name: return sizeof(typename functor::Consts);
    DSOPT_UPDATE_RULES(DSOPT_RULE_CONSTS_BYTES)
#undef DSOPT_RULE_CONSTS_BYTES
  }
  return 0;
}
// Whether C is `rule`'s constants.
template <class C>
bool rule_takes_consts(UpdateRule rule) {
  switch (rule) {
#define DSOPT_RULE_TAKES(name, functor) \
  case UpdateRule::name: return std::is_same_v<typename functor::Consts, C>;
    DSOPT_UPDATE_RULES(DSOPT_RULE_TAKES)
#undef DSOPT_RULE_TAKES
  }
  return false;
}
DSOPT_ISA_END

// One tensor of a compressed allreduce (docs/design/compressed-allreduce.md): x holds
// n values; the padded length n' (a multiple of 8P) splits into P chunks of
// c = n'/P; rank j's message carries every tensor's chunk-j bits back to
// back, this tensor's at byte `chunk_offset` (c/8 bytes).
struct CarTensor {
  float* x;             // n values, read by the worker side, written by decode
  int64_t n;
  int64_t padded;       // n'
  float* worker_error;  // n' values
  float* server_error;  // c values
  int64_t chunk_offset; // bytes
  uint8_t* bits = nullptr;  // car_worker_sumsq: where it also writes the signs, if set
};

// One tensor of an update: its streams indexed by Operand
// (math/update_rule.hpp), nullptr where it has none; a rule touches those
// it declares. Param is the fp32 value updated in place: the caller's
// parameter when it is fp32, dsopt's master copy otherwise, in which case
// the rounded result is also written to Param16.
struct UpdateSlot {
  void* streams[kOperandCount] = {};
  int64_t numel = 0;
  int32_t group = 0;                 // index into the rule's constants
  DType grad_dtype = DType::F32;     // of Grad
  DType param16_dtype = DType::F32;  // of Param16 (F16 or BF16) when it is set

  void* data(Operand o) const { return streams[int(o)]; }
  float* floats(Operand o) const { return static_cast<float*>(streams[int(o)]); }
  void set(Operand o, const void* p) { streams[int(o)] = const_cast<void*>(p); }
};

// A slot with the streams every rule of the Adam family has: the parameter
// (param16 nullptr when it is fp32, else of param_dtype), the gradient, m
// and v.
inline UpdateSlot moment_slot(float* master, void* param16, DType param_dtype, const void* grad,
                              DType grad_dtype, float* m, float* v, int64_t numel, int32_t group) {
  UpdateSlot s;
  s.set(Operand::Param, master);
  s.set(Operand::Param16, param16);
  s.set(Operand::Grad, grad);
  s.set(Operand::M, m);
  s.set(Operand::V, v);
  s.numel = numel;
  s.group = group;
  s.grad_dtype = grad_dtype;
  s.param16_dtype = param_dtype;
  return s;
}

class Kernels {
 public:
  virtual ~Kernels() = default;
  // Bytes held by the live DeviceBuffers allocated through this object
  // (dsopt_memory_usage).
  size_t buffer_bytes() const { return buffer_bytes_; }

  virtual Device device() const = 0;
  virtual const char* name() const = 0;  // e.g. "avx512", "cuda"
  // CPU threads of the kernels (0 on a device), and setting them between
  // calls (results do not depend on them).
  virtual int threads() const { return 0; }
  virtual void set_threads(int threads) { (void)threads; }

  // Memory of this device. alloc throws Error(DSOPT_ENOMEM) on failure;
  // alloc(0) returns nullptr.
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // A host region of at least `bytes` for staging this device's transfers
  // (pinned for CUDA), owned by this object and reused: valid until the
  // next call or the object's destruction.
  virtual void* host_staging(size_t bytes) = 0;

  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst_host, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // Uploads for ZeRO-Offload: host memory made fast to copy from (page-
  // locked for CUDA; nothing for the CPU) until unpin; and copies queued
  // without waiting, on one of two lanes: wait_lane(lane) returns once every
  // copy queued on that lane so far has finished reading its source. The
  // defaults copy at once.
  virtual void pin(void* host, size_t bytes) { (void)host; (void)bytes; }
  virtual void unpin(void* host) { (void)host; }
  virtual void copy_from_host_async(void* dst, const void* src_host, size_t bytes, int lane) {
    (void)lane;
    copy_from_host(dst, src_host, bytes);
  }
  virtual void wait_lane(int lane) { (void)lane; }
  // Waits until all work queued by this object has finished.
  virtual void synchronize() = 0;

  // dst[i] = float(src[i]) for a tensor of any dtype.
  virtual void to_float(const TensorRef& src, float* dst) = 0;
  // dst[i] = round-to-nearest-even(src[i]) in dtype.
  virtual void from_float(const float* src, void* dst, DType dtype, int64_t n) = 0;

  // One pass over `count` tensors: y = fl(float(x) * mul) for every element.
  // When `dst` is not null the y values of all tensors are written to it
  // back to back (dst may alias src[0].data when there is one fp32 tensor).
  // When `sumsq_host` is not null, sumsq_host[i] receives the sum of y^2 of
  // tensor i in the order of math/sum_squares.hpp. Returns whether any x was
  // Inf or NaN.
  virtual GradStats transform(const TensorRef* src, int64_t count, float mul, float* dst,
                              double* sumsq_host) = 0;
  // The same pass adding into dst: dst = fl(dst + float(x)) for the
  // elements of all tensors back to back. Returns whether any x was Inf or
  // NaN.
  virtual GradStats accumulate(const TensorRef* src, int64_t count, float* dst) = 0;

  // `rule` over every slot; consts[slot.group] holds the slot's group (or
  // tensor) constants, of the type the rule reads (its Consts: AdamConsts,
  // OneBitConsts, LambConsts or ZeroOneConsts). Each gradient element is
  // first multiplied by mul1 then by mul2 (two fp32 roundings; 1.0f is
  // exact); rules that declare no Grad read none. With sumsq_host (rules
  // that read the gradient), sumsq_host[i] also receives the sum of squares
  // of slot i's gradient values as read, before mul1 and mul2: what
  // transform() with mul 1 gives for them, bit for bit.
  template <class C>
  void update(UpdateRule rule, const UpdateSlot* slots, int64_t count, const C* consts,
              int32_t num_groups, float mul1, float mul2, double* sumsq_host = nullptr) {
    if (!rule_takes_consts<C>(rule))
      fail(DSOPT_EINTERNAL, "update rule " + std::to_string(int(rule)) +
                                " given constants of another rule's type");
    if (sumsq_host)
      update_records_summed(rule, slots, count, consts, num_groups, mul1, mul2, sumsq_host);
    else
      update_records(rule, slots, count, consts, num_groups, mul1, mul2);
  }

  // update() once the constants' type is checked: `consts` holds
  // num_groups records of rule_consts_bytes(rule) bytes.
  virtual void update_records(UpdateRule rule, const UpdateSlot* slots, int64_t count,
                              const void* consts, int32_t num_groups, float mul1, float mul2) = 0;
  // The same with sums, taken while updating (no extra pass over the
  // gradients), from kernels that say sums_while_updating(); the step
  // pipeline asks no others (they sum in a pass over the gradients).
  virtual bool sums_while_updating() const { return false; }
  virtual void update_records_summed(UpdateRule rule, const UpdateSlot*, int64_t, const void*,
                                     int32_t, float, float, double*) {
    fail(DSOPT_EINTERNAL, std::string(name()) + " kernels do not sum while updating (rule " +
                              std::to_string(int(rule)) + ")");
  }

  // max_host[i] = the largest value of fp32 tensor i (numel > 0, no NaN);
  // a maximum does not depend on the order, so every backend agrees.
  virtual void max_per_tensor(const TensorRef* src, int64_t count, float* max_host) = 0;

  // ---- block codecs of compressed ZeRO (math/block_codec.hpp) ---------------------
  // Encodes `runs` runs of n elements each: run j is g[j*n, (j+1)*n) (plus
  // the residual e_in there times e_mul when e_in is non-null), written to
  // out + j * codec_run_bytes(c, block, n). Residuals are int8 runs of the
  // same blocks (run j at j * codec_run_bytes(BlockCodec::Int8, block, n));
  // with e_out (may equal e_in) the residuals of x - x' go there.
  virtual void codec_encode(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in,
                            float e_mul, uint8_t* e_out, int64_t n, int runs, uint8_t* out) = 0;
  // dst[i] = the sum over runs j = 0..runs-1, in that order, of the decoded
  // element i of the run at in + j * codec_run_bytes(c, block, n).
  virtual void codec_decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs,
                                int64_t n, float* dst) = 0;

  // ---- compressed allreduce (docs/design/compressed-allreduce.md section 3) ----------
  // Sums of squares in the order of math/sum_squares.hpp, one per tensor,
  // returned in sumsq_host; scales and weights are host arrays.
  //
  // W1/W2: sumsq_host[t] = sum over i < n' of y^2, y = pad(x, n') + e_w;
  // with t.bits set, also the sign bits of y (W4/W5, 1 iff !(y < 0), MSB
  // first) of element i to bits + chunk_offset + i / 8 (e_w unchanged).
  virtual void car_worker_sumsq(const CarTensor* t, int64_t count, double* sumsq_host) = 0;
  // W3-W6: y as above; e_w = y - s*sigma(y) with s = scales_host[t]; the
  // sign bits (1 iff !(y < 0), MSB first) of chunk j go to
  // send + j * msg_bytes + chunk_offset.
  virtual void car_worker_pack(const CarTensor* t, int64_t count, int world,
                               const float* scales_host, uint8_t* send, int64_t msg_bytes) = 0;
  // S1/S2 for this rank's chunk: z = sum over senders i = 0..P-1 in order of
  // u_i * weights_host[i * count + t] (u_i = +1/-1 from the bits at
  // recv + i * msg_bytes + chunk_offset), then z = z + e_s, stored in e_s;
  // sumsq_host[t] = sum of z^2 over the c elements.
  virtual void car_server_sum(const CarTensor* t, int64_t count, int world, const uint8_t* recv,
                              int64_t msg_bytes, const float* weights_host, double* sumsq_host) = 0;
  // S4/S5: z read from e_s; e_s = z - s*sigma(z), s = scales_host[t]; bits
  // to out + chunk_offset.
  virtual void car_server_pack(const CarTensor* t, int64_t count, int world,
                               const float* scales_host, uint8_t* out) = 0;
  // F1/F2: x[k] = (+1 or -1) * scales_host[j * count + t] for k < n, bits
  // of chunk j at gathered + j * msg_bytes + chunk_offset.
  virtual void car_decode(const CarTensor* t, int64_t count, int world, const uint8_t* gathered,
                          int64_t msg_bytes, const float* scales_host) = 0;

 private:
  friend class DeviceBuffer;
  size_t buffer_bytes_ = 0;
};

// The CPU kernels for this machine's best instruction set, using `threads`
// threads of their pool (kernels/cpu/thread_pool.hpp; 0: OpenMP's default
// count, omp_get_max_threads()).
std::unique_ptr<Kernels> make_cpu_kernels(int threads);
// The CPU instruction set the CPU kernels pick on this machine.
const char* cpu_isa_name();

// The CUDA kernels on the current device, queueing work on `stream`
// (a cudaStream_t, nullptr = legacy default). Throws Error(DSOPT_EUNSUPPORTED)
// in a build without CUDA or without a usable device.
std::unique_ptr<Kernels> make_cuda_kernels(void* stream);
// Whether p is CUDA device memory (false in a build without CUDA or without
// a driver). Used to reject buffers on the wrong device.
bool is_cuda_device_pointer(const void* p);
// "cuda=<runtime version>" or "cuda=off", for dsopt_build_info.
std::string cuda_build_info();

}  // namespace dsopt
