// CodecRuns: one of compressed ZeRO's codes (math/block_codec.hpp's int8,
// int4 and sign, or bf16) on one device, over runs of fp32 values, for a
// caller that moves the codes itself (dsopt_codec, include/dsopt.h
// "Codecs"). The arguments are checked by the caller (src/api); this class
// checks only what needs the device: where a buffer lives.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kernels/kernels.hpp"
#include "math/block_codec.hpp"

namespace dsopt {

class CodecRuns {
 public:
  // The block of a codec made with block 0: compressed ZeRO's gradient blocks.
  static constexpr int64_t kDefaultBlock = 64;

  // `name`: "int8", "int4", "sign" or "bf16"; `block` 0 or a multiple of 8
  // in [8, 65536] (0 for bf16). Fails with DSOPT_EINVAL on a bad name or
  // block, DSOPT_EUNSUPPORTED where CUDA is not there.
  CodecRuns(const std::string& name, int64_t block, bool cuda, int threads, void* stream);

  bool has_residual() const { return codec_.has_value(); }  // bf16 keeps none
  // Bytes of the code, and of the residual, of one run of n > 0 values.
  int64_t encoded_bytes(int64_t n) const;
  int64_t residual_bytes(int64_t n) const;

  // `runs` runs of n values each from g into dst (and, when residual is
  // not null, with error feedback through it, in place).
  void encode(const float* g, int64_t n, int64_t runs, uint8_t* residual, uint8_t* dst);
  // dst = the sum over the runs, in run order, of their decoded values.
  void decode_sum(const uint8_t* codes, int64_t n, int64_t runs, float* dst);

  // CUDA: later work goes on `stream` (the work queued so far is waited for).
  void set_stream(void* stream);
  // Fails with DSOPT_EINVAL naming `what` when p is not memory of this
  // codec's device.
  void require_on_device(const void* p, const std::string& what) const;

 private:
  std::optional<BlockCodec> codec_;  // none: bf16
  int64_t block_ = 0;
  bool cuda_ = false;
  int device_index_ = -1;  // the CUDA device of a CUDA codec
  void* stream_ = nullptr;
  std::unique_ptr<Kernels> kernels_;
};

}  // namespace dsopt
