// Work split and bit layout of the CUDA compressed-allreduce kernels
// (car_kernels.cuh), kept free of CUDA calls so host code (the launcher and
// tests/internal/test_cuda_car_layout.cpp) uses the very same functions.
//
// One launch per primitive covers every tensor: each tensor's elements
// (n' for the worker, c = n'/P for the server, n for decode) are cut into
// blocks of kSumBlock elements, one CUDA block of kSumLanes threads each; a
// block finds its tensor by binary search over the tensors' first block
// indices. Per-tensor metadata, scales and weights travel in one device
// buffer laid out by car_meta_layout. Inside a block, iteration `it` covers
// elements begin + it*kSumLanes + [0, kSumLanes): thread j takes one element,
// so lane j of the sum order (math/sum_squares.hpp) is thread j. Sign bits
// are gathered per warp (32 consecutive elements, bit k = element k) and
// written as 4 MSB-first bytes by lanes 0..3.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/kernels.hpp"
#include "math/hd.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace cuda {

enum class CarOp : int32_t { WorkerSumsq, WorkerPack, ServerSum, ServerPack, Decode };

// One tensor as the kernels see it (device copy of CarTensor plus the
// launch's bookkeeping).
struct CarItem {
  float* x;
  float* worker_error;
  float* server_error;
  int64_t n;
  int64_t padded;
  int64_t chunk;         // c = n' / P
  int64_t chunk_offset;  // bytes
  int64_t len;           // elements this primitive covers: n', c or n
  uint8_t* bits;         // worker sums: where the signs go too (nullptr: nowhere)
  float scale;           // this rank's scale (the pack kernels)
  int32_t pad_;
};

// The kernels' arguments (passed by value).
struct CarArgs {
  const CarItem* items;   // count, device memory
  const int64_t* first;   // count + 1 first block indices, device memory
  const float* table;     // world * count weights or scales (server_sum, decode), device memory
  int32_t count;
  int32_t world;
  const uint8_t* in;      // recv (server_sum) or gathered (decode)
  uint8_t* out;           // send (worker_pack) or server bits (server_pack)
  int64_t msg_bytes;
  double* block_sums;     // one per block (the sum kernels)
};

// Byte offsets of the parts of the metadata buffer.
struct CarMetaLayout {
  size_t items, first, table, bytes;
};

inline CarMetaLayout car_meta_layout(int64_t count, int64_t table_len) {
  CarMetaLayout l;
  l.items = 0;
  l.first = size_t(count) * sizeof(CarItem);
  l.table = l.first + size_t(count + 1) * sizeof(int64_t);
  l.bytes = l.table + size_t(table_len) * sizeof(float);
  return l;
}

// Elements the primitive covers in tensor t.
inline int64_t car_len(CarOp op, const CarTensor& t, int world) {
  switch (op) {
    case CarOp::WorkerSumsq:
    case CarOp::WorkerPack: return t.padded;
    case CarOp::ServerSum:
    case CarOp::ServerPack: return t.padded / world;
    case CarOp::Decode: return t.n;
  }
  return 0;
}

// Fills the metadata buffer (host memory, car_meta_layout(count,
// table_len).bytes) for one call; scales (count values) may be null, table
// (table_len values) may be null when table_len is 0. Returns the number of
// blocks of the launch.
inline int64_t car_write_meta(void* dst, CarOp op, const CarTensor* t, int64_t count, int world,
                              const float* scales, const float* table, int64_t table_len) {
  const CarMetaLayout l = car_meta_layout(count, table_len);
  auto* base = static_cast<unsigned char*>(dst);
  auto* items = reinterpret_cast<CarItem*>(base + l.items);
  auto* first = reinterpret_cast<int64_t*>(base + l.first);
  auto* tab = reinterpret_cast<float*>(base + l.table);
  int64_t blocks = 0;
  for (int64_t i = 0; i < count; ++i) {
    CarItem& it = items[i];
    it.x = t[i].x;
    it.worker_error = t[i].worker_error;
    it.server_error = t[i].server_error;
    it.n = t[i].n;
    it.padded = t[i].padded;
    it.chunk = t[i].padded / world;
    it.chunk_offset = t[i].chunk_offset;
    it.len = car_len(op, t[i], world);
    it.bits = t[i].bits;
    it.scale = scales != nullptr ? scales[i] : 0.0f;
    it.pad_ = 0;
    first[i] = blocks;
    blocks += sum_blocks(it.len);
  }
  first[count] = blocks;
  for (int64_t i = 0; i < table_len; ++i) tab[i] = table[i];
  return blocks;
}

DSOPT_ISA_BEGIN

// The tensor whose blocks contain `block`: the last t with first[t] <= block
// (tensors with no blocks share their successor's first index and are
// never chosen).
DSOPT_HD int car_find_tensor(const int64_t* first, int count, int64_t block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= block) lo = mid; else hi = mid - 1;
  }
  return lo;
}

DSOPT_HD uint32_t car_bit_reverse(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __brev(x);
#else
  uint32_t r = 0;
  for (int k = 0; k < 32; ++k) r |= ((x >> k) & 1u) << (31 - k);
  return r;
#endif
}

// Byte q (0..3) of a warp's 32 elements, MSB first (docs/design/compressed-allreduce.md
// section 5), from the ballot whose bit k is element k's sign bit.
DSOPT_HD uint8_t car_ballot_byte(uint32_t ballot, int q) {
  return uint8_t((car_bit_reverse(ballot) >> (24 - 8 * q)) & 0xFFu);
}

// Where the worker's sign byte of elements [e, e + 8) goes (e a multiple of
// 8): chunk j = e / c of the message to rank j.
DSOPT_HD int64_t car_send_byte(const CarItem& t, int64_t e, int64_t msg_bytes) {
  const int64_t j = e / t.chunk;
  return j * msg_bytes + t.chunk_offset + (e - j * t.chunk) / 8;
}

DSOPT_ISA_END

}  // namespace cuda
}  // namespace dsopt
