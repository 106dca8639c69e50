#include "kernels/cpu/cpu_car.hpp"

#include <vector>

#include "kernels/cpu/block_grid.hpp"
#include "kernels/cpu/cpu_loops.hpp"
#include "math/sign_compress.hpp"

namespace dsopt {
namespace cpu_car {
namespace {

std::vector<int64_t> padded_lengths(const CarTensor* t, int64_t count) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(t[i].padded);
  return v;
}
std::vector<int64_t> chunk_lengths(const CarTensor* t, int64_t count, int world) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(t[i].padded / world);
  return v;
}
// y = pad(x, n') + e_w at element i.
inline float worker_y(const CarTensor& t, int64_t i) {
  return (i < t.n ? t.x[i] : 0.0f) + t.worker_error[i];
}

}  // namespace

void worker_sumsq(const CarTensor* t, int64_t count, int threads, double* sumsq) {
  BlockGrid(padded_lengths(t, count)).run(threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    float y[kSumBlock];
    for (int64_t i = b; i < e; ++i) y[i - b] = worker_y(t[k], i);
    return cpu::block_sum_squares(y, e - b);
  });
}

void worker_pack(const CarTensor* t, int64_t count, int world, const float* scales, uint8_t* send,
                 int64_t msg_bytes, int threads) {
  BlockGrid(padded_lengths(t, count)).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    const CarTensor& ct = t[k];
    const int64_t c = ct.padded / world;
    const float s = scales[k];
    for (int64_t i = b; i < e; i += 8) {  // blocks and chunks start on multiples of 8
      uint32_t byte = 0;
      for (int64_t j = i; j < i + 8; ++j) {
        const float y = worker_y(ct, j);
        ct.worker_error[j] = sign_error(y, s);
        byte = byte << 1 | sign_bit(y);
      }
      const int64_t chunk = i / c;
      send[chunk * msg_bytes + ct.chunk_offset + (i - chunk * c) / 8] = uint8_t(byte);
    }
    return 0.0;
  });
}

void server_sum(const CarTensor* t, int64_t count, int world, const uint8_t* recv, int64_t msg_bytes,
                const float* weights, double* sumsq, int threads) {
  BlockGrid(chunk_lengths(t, count, world)).run(threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    const CarTensor& ct = t[k];
    float z[kSumBlock];
    for (int64_t i = b; i < e; ++i) {
      float acc = 0.0f;
      for (int s = 0; s < world; ++s) {
        const float w = weights[size_t(s) * size_t(count) + k];
        acc = acc + (chunk_bit(recv + s * msg_bytes + ct.chunk_offset, i) ? w : -w);
      }
      acc = acc + ct.server_error[i];
      ct.server_error[i] = acc;
      z[i - b] = acc;
    }
    return cpu::block_sum_squares(z, e - b);
  });
}

void server_pack(const CarTensor* t, int64_t count, int world, const float* scales, uint8_t* out,
                 int threads) {
  BlockGrid(chunk_lengths(t, count, world)).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    const CarTensor& ct = t[k];
    const float s = scales[k];
    for (int64_t i = b; i < e; i += 8) {
      uint32_t byte = 0;
      for (int64_t j = i; j < i + 8; ++j) {
        const float z = ct.server_error[j];
        ct.server_error[j] = sign_error(z, s);
        byte = byte << 1 | sign_bit(z);
      }
      out[ct.chunk_offset + i / 8] = uint8_t(byte);
    }
    return 0.0;
  });
}

void decode(const CarTensor* t, int64_t count, int world, const uint8_t* gathered, int64_t msg_bytes,
            const float* scales, int threads) {
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < count; ++i) lengths.push_back(t[i].n);
  BlockGrid(lengths).run(threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    const CarTensor& ct = t[k];
    const int64_t c = ct.padded / world;
    for (int64_t i = b; i < e; ++i) {
      const int64_t j = i / c;
      const float s = scales[size_t(j) * size_t(count) + k];
      ct.x[i] = chunk_bit(gathered + j * msg_bytes + ct.chunk_offset, i - j * c) ? s : -s;
    }
    return 0.0;
  });
}

}  // namespace cpu_car
}  // namespace dsopt
