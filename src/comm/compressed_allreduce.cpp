#include "comm/compressed_allreduce.hpp"

#include <algorithm>
#include <numeric>

#include "base/error.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace {

// Automatic pieces: at least kMinPieceBlocks sum blocks (32 KB of signs for
// each rank), at most kMaxPieces per call.
constexpr int64_t kMinPieceBlocks = 64;
constexpr int64_t kMaxPieces = 32;

}  // namespace

int64_t CompressedAllreduce::padded_length(int64_t n, int world) {
  const int64_t divider = int64_t(8) * world / std::gcd(int64_t(world), int64_t(8));
  const int64_t unit = int64_t(world) * divider;
  return n % unit == 0 ? n : n + unit - n % unit;
}

CompressedAllreduce::CompressedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem,
                                         std::vector<int64_t> sizes, int64_t piece_blocks)
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
    int64_t blocks = 0;
    for (const CarTensor& t : tensors_) blocks += sum_blocks(t.padded / world_);
    if (piece_blocks <= 0)
      piece_blocks = comm.overlaps(mem) ? std::max(kMinPieceBlocks, (blocks + kMaxPieces - 1) / kMaxPieces)
                                        : std::max<int64_t>(blocks, 1);
    pieces_ = car_pieces(tensors_, world_, piece_blocks);
    int64_t largest = 0;
    for (const CarPiece& p : pieces_) largest = std::max(largest, p.bytes);
    if (pieces_.size() > 1) discard_ = DeviceBuffer(kernels_, size_t(largest) * size_t(world_));
  }
}

void CompressedAllreduce::reset_errors() {
  kernels_.fill_zero(worker_error_.get(), worker_error_.bytes());
  kernels_.fill_zero(server_error_.get(), server_error_.bytes());
}

}  // namespace dsopt
