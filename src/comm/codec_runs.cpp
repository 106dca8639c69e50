#include "comm/codec_runs.hpp"

#include "base/error.hpp"
#include "kernels/device_pointer.hpp"

namespace dsopt {
namespace {

std::optional<BlockCodec> codec_named(const std::string& name) {
  if (name == "int8") return BlockCodec::Int8;
  if (name == "int4") return BlockCodec::Int4;
  if (name == "sign") return BlockCodec::Sign;
  if (name == "bf16") return std::nullopt;
  fail(DSOPT_EINVAL, "unknown codec name \"" + name + "\": one of \"int8\", \"int4\", \"sign\", \"bf16\"");
}

}  // namespace

CodecRuns::CodecRuns(const std::string& name, int64_t block, bool cuda, int threads, void* stream)
    : codec_(codec_named(name)), cuda_(cuda), stream_(stream) {
  if (!codec_) {
    if (block != 0) fail(DSOPT_EINVAL, "block is " + std::to_string(block) + ": bf16 codes have no blocks (0)");
  } else {
    block_ = block == 0 ? kDefaultBlock : block;
    if (block_ < 8 || block_ > 65536 || block_ % 8)
      fail(DSOPT_EINVAL, "block must be 0 or a multiple of 8 in [8, 65536], got " + std::to_string(block));
  }
  if (threads < 0) fail(DSOPT_EINVAL, "threads must be >= 0, got " + std::to_string(threads));
  kernels_ = cuda ? make_cuda_kernels(stream) : make_cpu_kernels(threads);
  if (cuda) device_index_ = cuda_current_device();
}

int64_t CodecRuns::encoded_bytes(int64_t n) const {
  return codec_ ? codec_run_bytes(*codec_, block_, n) : 2 * n;
}

int64_t CodecRuns::residual_bytes(int64_t n) const {
  if (!codec_) fail(DSOPT_EUNSUPPORTED, "bf16 codes keep no error-feedback residual");
  return codec_run_bytes(BlockCodec::Int8, block_, n);
}

void CodecRuns::encode(const float* g, int64_t n, int64_t runs, uint8_t* residual, uint8_t* dst) {
  if (!codec_) {
    kernels_->from_float(g, dst, DType::BF16, n * runs);
    return;
  }
  kernels_->codec_encode(*codec_, block_, g, residual, 1.0f, residual, n, int(runs), dst);
}

void CodecRuns::decode_sum(const uint8_t* codes, int64_t n, int64_t runs, float* dst) {
  if (codec_) {
    kernels_->codec_decode_sum(*codec_, block_, codes, int(runs), n, dst);
    return;
  }
  kernels_->to_float(TensorRef{codes, n, DType::BF16}, dst);
  for (int64_t j = 1; j < runs; ++j) {
    const TensorRef run{codes + j * 2 * n, n, DType::BF16};
    kernels_->accumulate(&run, 1, dst);
  }
}

void CodecRuns::set_stream(void* stream) {
  if (!cuda_ || stream == stream_) return;
  // The kernels of the new stream are made on the current device.
  const int current = cuda_current_device();
  if (current != device_index_)
    fail(DSOPT_EINVAL, "the current CUDA device is " + std::to_string(current) + ", the codec's is " +
                           std::to_string(device_index_) + ": make it current before setting its stream");
  std::unique_ptr<Kernels> next = make_cuda_kernels(stream);
  kernels_->synchronize();
  kernels_ = std::move(next);
  stream_ = stream;
}

void CodecRuns::require_on_device(const void* p, const std::string& what) const {
  const int on = cuda_device_of(p);
  if (on == device_index_) return;
  const std::string where = on < 0 ? "host memory" : "memory of CUDA device " + std::to_string(on);
  const std::string mine = device_index_ < 0 ? "host" : "CUDA device " + std::to_string(device_index_);
  fail(DSOPT_EINVAL, what + " is " + where + ", but the codec's buffers live on the " + mine);
}

}  // namespace dsopt
