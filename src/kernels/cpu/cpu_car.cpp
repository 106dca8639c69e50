#include "kernels/cpu/cpu_car.hpp"

#include <vector>

#include "kernels/cpu/block_grid.hpp"

namespace dsopt {
namespace cpu_car {
namespace {

std::vector<int64_t> lengths(const CarTensor* t, int64_t count, int64_t (*len)(const CarTensor&, int),
                             int world) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(len(t[i], world));
  return v;
}
int64_t padded(const CarTensor& t, int) { return t.padded; }
int64_t chunk(const CarTensor& t, int world) { return t.padded / world; }
int64_t original(const CarTensor& t, int) { return t.n; }

}  // namespace

void worker_sumsq(const CpuIsa& isa, const CarTensor* t, int64_t count, int threads, double* sumsq) {
  BlockGrid(lengths(t, count, padded, 1)).run(threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    return isa.car_worker_sumsq_block(t[k], b, e);
  });
}

void worker_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales,
                 uint8_t* send, int64_t msg_bytes, int threads) {
  BlockGrid(lengths(t, count, padded, world)).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_worker_pack_block(t[k], b, e, world, scales[k], send, msg_bytes);
    return 0.0;
  });
}

void server_sum(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* recv,
                int64_t msg_bytes, const float* weights, double* sumsq, int threads) {
  BlockGrid(lengths(t, count, chunk, world)).run(threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    return isa.car_server_sum_block(t[k], b, e, world, recv, msg_bytes, weights, count, k);
  });
}

void server_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales,
                 uint8_t* out, int threads) {
  BlockGrid(lengths(t, count, chunk, world)).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_server_pack_block(t[k], b, e, scales[k], out);
    return 0.0;
  });
}

void decode(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* gathered,
            int64_t msg_bytes, const float* scales, int threads) {
  BlockGrid(lengths(t, count, original, world)).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_decode_block(t[k], b, e, world, gathered, msg_bytes, scales, count, k);
    return 0.0;
  });
}

}  // namespace cpu_car
}  // namespace dsopt
