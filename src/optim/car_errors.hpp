// The rank-local error buffers of a CompressedAllreduce in the state blob
// (docs/design/decisions.md K1/K2): saved with the world size that produced them, restored
// only at that world size (zero otherwise). Shared by the 1-bit optimizers.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "state/blob.hpp"

namespace dsopt {

class CarErrors {
 public:
  // Sections <prefix>.worker_error and <prefix>.server_error for tensors of
  // the given sizes.
  CarErrors(std::string prefix, std::vector<int64_t> sizes)
      : prefix_(std::move(prefix)), sizes_(std::move(sizes)) {}

  // The largest world size a blob may record for its errors: beyond it the
  // padded lengths (8 P^2 elements per tensor at most) would overflow.
  static constexpr int32_t kMaxWorld = int32_t(1) << 24;
  // Throws Error(DSOPT_ECORRUPT) unless `saved_world` is 0 (no errors) or in
  // [2, kMaxWorld].
  static void check_world(int32_t saved_world);

  // Bytes of the worker and server errors at `world` ranks (0 for world <= 1).
  std::pair<uint64_t, uint64_t> bytes(int world) const;
  // The world size to record with the errors of `car` (0: none).
  static int32_t world_of(const CompressedAllreduce* car) { return car ? car->world() : 0; }

  void save(BlobWriter& w, const CompressedAllreduce* car, Kernels& kernels) const;
  // Throws Error(DSOPT_ECORRUPT) when the sections do not fit `saved_world`.
  void check(const BlobReader& r, int32_t saved_world) const;
  // Copies the saved errors into `car` when it runs at `saved_world` ranks;
  // leaves them as they are (zero) otherwise. Returns whether it restored.
  bool restore(const BlobReader& r, int32_t saved_world, CompressedAllreduce* car,
               Kernels& kernels) const;

 private:
  std::string prefix_;
  std::vector<int64_t> sizes_;
};

}  // namespace dsopt
