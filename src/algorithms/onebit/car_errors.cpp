#include "algorithms/onebit/car_errors.hpp"

#include "base/error.hpp"

namespace dsopt {

std::pair<uint64_t, uint64_t> CarErrors::bytes(int world) const {
  if (world <= 1) return {0, 0};
  uint64_t worker = 0;
  for (int64_t n : sizes_) worker += uint64_t(CompressedAllreduce::padded_length(n, world)) * 4;
  return {worker, worker / uint64_t(world)};
}

StateSchema::Slice CarErrors::tensor_slice(float* worker_errors, size_t t, int world) const {
  if (!worker_errors || t >= sizes_.size()) return {};
  int64_t at = 0;
  for (size_t u = 0; u < t; ++u) at += CompressedAllreduce::padded_length(sizes_[u], world);
  return {true, worker_errors + at, sizes_[t], 0};
}

void CarErrors::check_world(int32_t saved_world) {
  if (saved_world < 0 || saved_world == 1 || saved_world > kMaxWorld)
    fail(DSOPT_ECORRUPT, "state blob: invalid world size of the compression errors (" +
                             std::to_string(saved_world) + ")");
}

void CarErrors::describe(StateSchema& s, Kernels& kernels,
                         std::function<CompressedAllreduce*()> car,
                         std::function<bool(const BlobReader&)> restore_if,
                         StateSchema::Slicer slice, std::function<bool()> listed) const {
  const CarErrors self = *this;
  const auto length = [self, car](bool worker) {
    return [self, car, worker](const BlobReader* r) {
      const auto b = self.bytes(r ? self.saved_world(*r) : world_of(car()));
      return worker ? b.first : b.second;
    };
  };
  s.array(prefix_ + ".worker_error", kernels,
          [car]() -> void* { return car() ? car()->worker_error() : nullptr; }, length(true),
          restore_if)
      .view("worker_error", std::move(slice), std::move(listed))
      .array(prefix_ + ".server_error", kernels,
             [car]() -> void* { return car() ? car()->server_error() : nullptr; }, length(false),
             restore_if);
}

}  // namespace dsopt
