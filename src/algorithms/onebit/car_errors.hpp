// The rank-local error buffers of a CompressedAllreduce in the state blob
// (docs/design/decisions.md K1/K2): saved with the world size that produced them, restored
// only at that world size (zero otherwise). Shared by the 1-bit optimizers.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "state/state_schema.hpp"

namespace dsopt {

class CarErrors {
 public:
  // Reads the world size a (checked) blob recorded with its errors.
  using WorldReader = std::function<int32_t(const BlobReader&)>;

  // Sections <prefix>.worker_error and <prefix>.server_error for tensors of
  // the given sizes, whose blob records their world size where
  // `saved_world` reads it; `what` names the rank-local state they are part
  // of in dsopt_state_load's messages.
  CarErrors(std::string prefix, std::vector<int64_t> sizes, WorldReader saved_world,
            std::string what)
      : prefix_(std::move(prefix)),
        sizes_(std::move(sizes)),
        saved_world_(std::move(saved_world)),
        what_(std::move(what)) {}

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
  // The world size blob `r` recorded with the errors.
  int32_t saved_world(const BlobReader& r) const { return saved_world_(r); }
  // dsopt_state_load's description of blob `r`'s rank-local state: `what`
  // where its errors came from several ranks, else nothing.
  std::string rank_local_state(const BlobReader& r) const {
    return saved_world(r) > 1 ? what_ : std::string();
  }

  // The sections of the errors of car() (none: empty sections), as long as
  // the world size a blob recorded with them (saved_world, already checked
  // with check_world) says; restored into car() when `restore_if`.
  // The worker errors are the view "worker_error" through `slice`, listed
  // while `listed()`.
  void describe(StateSchema& s, Kernels& kernels, std::function<CompressedAllreduce*()> car,
                std::function<bool(const BlobReader&)> restore_if, StateSchema::Slicer slice,
                std::function<bool()> listed) const;
  // Tensor t's worker error in a buffer of errors at `world` ranks: the
  // tensors back to back, each padded, its first sizes[t] elements those of
  // the tensor in order. Not found without a buffer.
  StateSchema::Slice tensor_slice(float* worker_errors, size_t t, int world) const;

 private:
  std::string prefix_;
  std::vector<int64_t> sizes_;
  WorldReader saved_world_;
  std::string what_;
};

}  // namespace dsopt
