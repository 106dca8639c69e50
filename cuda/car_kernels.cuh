// The compressed-allreduce kernels (Kernels::car_*), one launch each for
// all tensors; work split and bit layout in car_layout.hpp. Element rules
// are math/sign_compress.hpp's, the same functions the CPU kernels
// (src/kernels/cpu/cpu_car.cpp) run, and sums of squares follow
// math/sum_squares.hpp exactly as the transform kernel does (thread j is
// lane j, then the fixed lane tree), so both backends give the same bits.
#pragma once
#include <cstdint>

#include "block_sum.cuh"
#include "car_layout.hpp"
#include "math/scalar_ops.hpp"
#include "math/sign_compress.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace cuda {

static_assert(kSumLanes % 32 == 0 && kSumBlock % kSumLanes == 0, "whole warps per block");

// The block's element range [begin, end) of tensor t.
struct CarBlock {
  const CarItem* t;
  int tensor;
  int64_t begin, end;
};

__device__ __forceinline__ CarBlock car_block(const CarArgs& a) {
  CarBlock b;
  const int64_t block = blockIdx.x;
  b.tensor = car_find_tensor(a.first, a.count, block);
  b.t = a.items + b.tensor;
  b.begin = (block - a.first[b.tensor]) * kSumBlock;
  b.end = min(b.t->len, b.begin + kSumBlock);
  return b;
}

// y = pad(x, n') + e_w at element i.
__device__ __forceinline__ float car_worker_y(const CarItem& t, int64_t i) {
  return ScalarOps::add(i < t.n ? t.x[i] : 0.0f, t.worker_error[i]);
}

// The warp's 32 sign bits as MSB-first bytes: lane q < 4 stores the byte of
// elements warp_base + 8q .. + 7 at `out + byte_at(e)` when they lie before
// `end` (block lengths are multiples of 8, so a byte is whole or absent).
template <class ByteAt>
__device__ __forceinline__ void car_store_bits(bool bit, int64_t warp_base, int64_t end,
                                               uint8_t* out, ByteAt byte_at) {
  const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, bit);
  const int q = threadIdx.x & 31;
  if (q < 4) {
    const int64_t e = warp_base + 8 * q;
    if (e < end) out[byte_at(e)] = car_ballot_byte(ballot, q);
  }
}

// W1/W2: per-block sums of y^2 over n'; with t.bits, W4/W5 too: the sign
// bits of element i to bits + chunk_offset + i / 8.
__global__ void __launch_bounds__(kSumLanes) car_worker_sumsq_kernel(const CarArgs a) {
  const CarBlock b = car_block(a);
  double acc = 0.0;
  if (b.t->bits == nullptr) {
    for (int64_t i = b.begin + threadIdx.x; i < b.end; i += kSumLanes)
      acc = add_square(acc, car_worker_y(*b.t, i));
  } else {
    uint8_t* out = b.t->bits + b.t->chunk_offset;
    for (int64_t base = b.begin; base < b.end; base += kSumLanes) {  // uniform over the block
      const int64_t i = base + threadIdx.x;
      bool bit = false;
      if (i < b.end) {
        const float y = car_worker_y(*b.t, i);
        acc = add_square(acc, y);
        bit = sign_bit(y) != 0u;
      }
      car_store_bits(bit, base + (threadIdx.x & ~31), b.end, out, [](int64_t e) { return e / 8; });
    }
  }
  store_block_sum(acc, &a.block_sums[blockIdx.x]);
}

// W3-W6: e_w = y - s sigma(y); bits of chunk j to out + j * msg_bytes + chunk_offset.
__global__ void __launch_bounds__(kSumLanes) car_worker_pack_kernel(const CarArgs a) {
  const CarBlock b = car_block(a);
  const CarItem& t = *b.t;
  const float s = t.scale;
  const int64_t msg_bytes = a.msg_bytes;
  for (int64_t base = b.begin; base < b.end; base += kSumLanes) {  // uniform over the block
    const int64_t i = base + threadIdx.x;
    bool bit = false;
    if (i < b.end) {
      const float y = car_worker_y(t, i);
      t.worker_error[i] = sign_error(y, s);
      bit = sign_bit(y) != 0u;
    }
    car_store_bits(bit, base + (threadIdx.x & ~31), b.end, a.out,
                   [&](int64_t e) { return car_send_byte(t, e, msg_bytes); });
  }
}

// S1/S2: z = sum over senders in order of +/-w, z += e_s, stored in e_s;
// per-block sums of z^2 over c.
__global__ void __launch_bounds__(kSumLanes) car_server_sum_kernel(const CarArgs a) {
  const CarBlock b = car_block(a);
  const CarItem& t = *b.t;
  const int world = a.world;
  const int64_t count = a.count;
  const float* weights = a.table + b.tensor;  // sender i's weight at i * count
  double acc2 = 0.0;
  for (int64_t k = b.begin + threadIdx.x; k < b.end; k += kSumLanes) {
    float acc = 0.0f;
    const uint8_t* bits = a.in + t.chunk_offset;
    for (int i = 0; i < world; ++i, bits += a.msg_bytes) {
      const float w = weights[int64_t(i) * count];
      acc = ScalarOps::add(acc, chunk_bit(bits, k) ? w : -w);
    }
    acc = ScalarOps::add(acc, t.server_error[k]);
    t.server_error[k] = acc;
    acc2 = add_square(acc2, acc);
  }
  store_block_sum(acc2, &a.block_sums[blockIdx.x]);
}

// S4/S5: e_s = z - s sigma(z); bits to out + chunk_offset.
__global__ void __launch_bounds__(kSumLanes) car_server_pack_kernel(const CarArgs a) {
  const CarBlock b = car_block(a);
  const CarItem& t = *b.t;
  const float s = t.scale;
  uint8_t* out = a.out + t.chunk_offset;
  for (int64_t base = b.begin; base < b.end; base += kSumLanes) {
    const int64_t k = base + threadIdx.x;
    bool bit = false;
    if (k < b.end) {
      const float z = t.server_error[k];
      t.server_error[k] = sign_error(z, s);
      bit = sign_bit(z) != 0u;
    }
    car_store_bits(bit, base + (threadIdx.x & ~31), b.end, out, [](int64_t e) { return e / 8; });
  }
}

// F1/F2: x[i] = +/- scale of chunk j = i / c, for i < n.
__global__ void __launch_bounds__(kSumLanes) car_decode_kernel(const CarArgs a) {
  const CarBlock b = car_block(a);
  const CarItem& t = *b.t;
  const int64_t c = t.chunk;
  const float* scales = a.table + b.tensor;  // chunk j's scale at j * count
  int64_t i = b.begin + threadIdx.x;
  if (i >= b.end) return;
  int64_t j = i / c, chunk_begin = j * c;
  for (; i < b.end; i += kSumLanes) {
    while (i - chunk_begin >= c) {  // at most kSumLanes / 8 times
      ++j;
      chunk_begin += c;
    }
    const float s = scales[j * int64_t(a.count)];
    t.x[i] = chunk_bit(a.in + j * a.msg_bytes + t.chunk_offset, i - chunk_begin) ? s : -s;
  }
}

}  // namespace cuda
}  // namespace dsopt
