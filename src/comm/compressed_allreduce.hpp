// The error-compensated 1-bit compressed allreduce (docs/design/compressed-allreduce.md,
// decisions.md C1-C5), built once on Comm and Kernels.
// Each tensor keeps its own padding, scales and error buffers; all tensors
// of a call travel together: one all-gather of scales per phase, and the
// signs in pieces (car_pieces.hpp) so that the arithmetic overlaps the
// transfers (compressed_allreduce_run.cpp). The results do not depend on
// the cut.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/car_pieces.hpp"
#include "comm/comm.hpp"
#include "kernels/device_buffer.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {

class CompressedAllreduce {
 public:
  // DeepSpeed's padded length: n rounded up to a multiple of P * lcm(P, 8).
  static int64_t padded_length(int64_t n, int world);

  // Tensors of the given sizes on `comm`; buffers in mem.kernels' memory.
  // Error buffers start at zero. Pieces of `piece_blocks` sum blocks of the
  // message (0: chosen here; one piece when comm cannot overlap transfers
  // on mem).
  CompressedAllreduce(Comm& comm, Kernels& kernels, const Mem& mem, std::vector<int64_t> sizes,
                      int64_t piece_blocks = 0);

  // Collective: x[t] (sizes[t] fp32 values each) becomes the compressed
  // average over ranks, identical on every rank. P == 1: unchanged. With
  // `out`, the average goes to out[t] instead (x[t] is read only; P == 1:
  // a copy).
  void run(float* const* x, float* const* out = nullptr);

  // Collective, world > 1: the first half of run, a compressed
  // reduce-scatter. The worker errors are updated as run updates them, and
  // this rank's chunk of every tensor (padded_length(n, P) / P values,
  // back to back) holds the server's sum z = e_s + the average of the
  // decoded worker signs, left in server_error(): its caller reads it and
  // sets it back to zero (NodeAwareAllreduce's 1-bit node step; run is
  // not called on the same object).
  void reduce_scatter(float* const* x);

  // The last run's result as it travelled: every rank's server signs (the
  // message layout of the pieces) and scales (world x count, rank-major).
  // decode_result turns such a result, this rank's or another one's with
  // the same sizes, into the values run's last phase writes, bit for bit.
  const void* result_codes() const { return send_.get(); }
  int64_t result_code_bytes() const { return msg_bytes_ * int64_t(world_); }
  const float* result_scales() const { return result_scales_.data(); }
  int64_t result_scale_count() const { return count() * int64_t(world_); }
  void decode_result(const void* codes, const float* scales, float* const* x);

  int world() const { return world_; }
  int64_t pieces() const { return int64_t(pieces_.size()); }
  int64_t count() const { return int64_t(tensors_.size()); }
  // All tensors' worker errors back to back (n' each), and server errors (c each).
  float* worker_error() const { return worker_error_.floats(); }
  int64_t worker_error_numel() const { return worker_numel_; }
  float* server_error() const { return server_error_.floats(); }
  int64_t server_error_numel() const { return worker_numel_ / world_; }
  void reset_errors();

 private:
  class Call;

  Comm& comm_;
  Kernels& kernels_;
  Mem mem_;
  std::unique_ptr<Kernels> host_;
  int world_;
  std::vector<CarTensor> tensors_;
  int64_t worker_numel_ = 0;
  int64_t msg_bytes_ = 0;  // one rank's chunk of every tensor, in bytes
  std::vector<CarPiece> pieces_;
  DeviceBuffer worker_error_, server_error_;
  DeviceBuffer send_, recv_, server_bits_;
  DeviceBuffer discard_;  // signs the error update writes again (one piece; none with one piece)
  std::vector<float> result_scales_;  // the last run's server scales, all ranks
};

}  // namespace dsopt
