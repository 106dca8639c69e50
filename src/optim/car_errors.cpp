#include "optim/car_errors.hpp"

#include "base/error.hpp"

namespace dsopt {

std::pair<uint64_t, uint64_t> CarErrors::bytes(int world) const {
  if (world <= 1) return {0, 0};
  uint64_t worker = 0;
  for (int64_t n : sizes_) worker += uint64_t(CompressedAllreduce::padded_length(n, world)) * 4;
  return {worker, worker / uint64_t(world)};
}

void CarErrors::save(BlobWriter& w, const CompressedAllreduce* car, Kernels& kernels) const {
  const auto b = bytes(world_of(car));
  w.section_from_device(prefix_ + ".worker_error", car ? car->worker_error() : nullptr, b.first, kernels);
  w.section_from_device(prefix_ + ".server_error", car ? car->server_error() : nullptr, b.second, kernels);
}

void CarErrors::check_world(int32_t saved_world) {
  if (saved_world < 0 || saved_world == 1 || saved_world > kMaxWorld)
    fail(DSOPT_ECORRUPT, "state blob: invalid world size of the compression errors (" +
                             std::to_string(saved_world) + ")");
}

void CarErrors::check(const BlobReader& r, int32_t saved_world) const {
  check_world(saved_world);
  const auto b = bytes(saved_world);
  r.section(prefix_ + ".worker_error", b.first);
  r.section(prefix_ + ".server_error", b.second);
}

bool CarErrors::restore(const BlobReader& r, int32_t saved_world, CompressedAllreduce* car,
                        Kernels& kernels) const {
  if (!car || saved_world != car->world()) return false;
  const auto b = bytes(saved_world);
  kernels.copy_from_host(car->worker_error(), r.section(prefix_ + ".worker_error", b.first), b.first);
  kernels.copy_from_host(car->server_error(), r.section(prefix_ + ".server_error", b.second), b.second);
  return true;
}

}  // namespace dsopt
