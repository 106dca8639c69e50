// The compressed allreduce's CPU loops over one sum block, written once
// against a vector type V (see cpu_loops.hpp). Sign bits are packed MSB
// first: a vector's lane mask (bit i = lane i) becomes bytes by reversing
// the bits of each 8-lane group.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_loops.hpp"
#include "math/sign_compress.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN
namespace cpu {

struct Reverse8 {
  uint8_t of[256];
  constexpr Reverse8() : of() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t r = 0;
      for (int k = 0; k < 8; ++k) r |= ((b >> k) & 1u) << (7 - k);
      of[b] = uint8_t(r);
    }
  }
};
inline constexpr Reverse8 kReverse8{};

// The bits of an 8-bit lane group in reverse order (a table: one load).
inline uint8_t reverse8(uint32_t b) { return kReverse8.of[b & 0xFFu]; }

// Lane mask of V::W (>= 8) elements starting at element k (a multiple of 8)
// of a chunk's bytes.
template <class V>
inline uint32_t lane_bits(const uint8_t* bytes, int64_t k) {
  uint32_t m = 0;
  for (int q = 0; q < V::W / 8; ++q) m |= uint32_t(reverse8(bytes[(k >> 3) + q])) << (8 * q);
  return m;
}

template <class V>
inline void store_lane_bits(uint8_t* bytes, int64_t k, uint32_t mask) {
  for (int q = 0; q < V::W / 8; ++q) bytes[(k >> 3) + q] = reverse8(mask >> (8 * q));
}

// y = pad(x, n') + e_w for lanes [i, i + V::W).
template <class V>
inline typename V::F worker_y(const CarTensor& t, int64_t i) {
  if (i + V::W <= t.n) return V::add(V::load(t.x + i), V::load(t.worker_error + i));
  float xs[V::W];
  for (int l = 0; l < V::W; ++l) xs[l] = i + l < t.n ? t.x[i + l] : 0.0f;
  return V::add(V::load(xs), V::load(t.worker_error + i));
}

// Sign bits of y[0, e - b) (elements [b, e), b and e multiples of 8) to
// bytes, element i at bytes[i / 8], one byte at a time (vector tails).
inline void store_sign_bytes(const float* y, int64_t b, int64_t e, uint8_t* bytes) {
  for (int64_t i = b; i < e; i += 8) {
    uint32_t byte = 0;
    for (int64_t j = i; j < i + 8; ++j) byte = byte << 1 | sign_bit(y[j - b]);
    bytes[i >> 3] = uint8_t(byte);
  }
}

template <class V>
double car_worker_sumsq_block(const CarTensor& t, int64_t b, int64_t e) {
  float y[kSumBlock];
  uint8_t* bytes = t.bits ? t.bits + t.chunk_offset : nullptr;
  int64_t i = b;
  for (; i + V::W <= e; i += V::W) {
    const typename V::F v = worker_y<V>(t, i);
    V::store(y + (i - b), v);
    if (V::W >= 8 && bytes) store_lane_bits<V>(bytes, i, V::nonneg_mask(v));
  }
  const int64_t tail = V::W >= 8 ? i : b;  // the signs still to store (from a multiple of 8)
  for (; i < e; ++i) y[i - b] = worker_y<VecScalar>(t, i);
  if (bytes) store_sign_bytes(y + (tail - b), tail, e, bytes);
  return block_sum_squares<V>(y, e - b);
}

// Bytes of elements [i, i + 8) one at a time (the tail of a vector loop).
inline uint8_t pack_byte_worker(const CarTensor& t, int64_t i, float s) {
  uint32_t byte = 0;
  for (int64_t j = i; j < i + 8; ++j) {
    const float y = worker_y<VecScalar>(t, j);
    t.worker_error[j] = sign_error(y, s);
    byte = byte << 1 | sign_bit(y);
  }
  return uint8_t(byte);
}

template <class V>
void car_worker_pack_block(const CarTensor& t, int64_t b, int64_t e, int world, float s,
                           uint8_t* send, int64_t msg_bytes) {
  const int64_t c = t.padded / world;
  const typename V::F pos = V::set1(-s), neg = V::set1(s);  // e = y - s*sign(y) = y + (-+s)
  for (int64_t i = b; i < e;) {
    const int64_t chunk = i / c;
    uint8_t* out = send + chunk * msg_bytes + t.chunk_offset - (chunk * c) / 8;
    const int64_t stop = std::min(e, (chunk + 1) * c);  // chunks and blocks start on multiples of 8
    if (V::W >= 8) {
      for (; i + V::W <= stop; i += V::W) {
        const typename V::F y = worker_y<V>(t, i);
        const uint32_t m = V::nonneg_mask(y);
        V::store(t.worker_error + i, V::add(y, V::select(m, pos, neg)));
        store_lane_bits<V>(out, i, m);
      }
    }
    for (; i < stop; i += 8) out[i >> 3] = pack_byte_worker(t, i, s);
  }
}

template <class V>
double car_server_sum_block(const CarTensor& t, int64_t b, int64_t e, int world,
                            const uint8_t* recv, int64_t msg_bytes, const float* weights,
                            int64_t count, size_t tensor) {
  float z[kSumBlock];
  int64_t i = b;
  if (V::W >= 8) {
    for (; i + V::W <= e; i += V::W) {
      typename V::F acc = V::set1(0.0f);
      for (int s = 0; s < world; ++s) {  // C4: ascending sender order
        const float w = weights[size_t(s) * size_t(count) + tensor];
        const uint32_t m = lane_bits<V>(recv + s * msg_bytes + t.chunk_offset, i);
        acc = V::add(acc, V::select(m, V::set1(w), V::set1(-w)));
      }
      acc = V::add(acc, V::load(t.server_error + i));
      V::store(t.server_error + i, acc);
      V::store(z + (i - b), acc);
    }
  }
  for (; i < e; ++i) {
    float acc = 0.0f;
    for (int s = 0; s < world; ++s) {
      const float w = weights[size_t(s) * size_t(count) + tensor];
      acc = acc + (chunk_bit(recv + s * msg_bytes + t.chunk_offset, i) ? w : -w);
    }
    acc = acc + t.server_error[i];
    t.server_error[i] = acc;
    z[i - b] = acc;
  }
  return block_sum_squares<V>(z, e - b);
}

template <class V>
void car_server_pack_block(const CarTensor& t, int64_t b, int64_t e, float s, uint8_t* out) {
  uint8_t* bytes = out + t.chunk_offset;
  const typename V::F pos = V::set1(-s), neg = V::set1(s);
  int64_t i = b;
  if (V::W >= 8) {
    for (; i + V::W <= e; i += V::W) {
      const typename V::F z = V::load(t.server_error + i);
      const uint32_t m = V::nonneg_mask(z);
      V::store(t.server_error + i, V::add(z, V::select(m, pos, neg)));
      store_lane_bits<V>(bytes, i, m);
    }
  }
  for (; i < e; i += 8) {
    uint32_t byte = 0;
    for (int64_t j = i; j < i + 8; ++j) {
      const float z = t.server_error[j];
      t.server_error[j] = sign_error(z, s);
      byte = byte << 1 | sign_bit(z);
    }
    bytes[i >> 3] = uint8_t(byte);
  }
}

template <class V>
void car_decode_block(const CarTensor& t, int64_t b, int64_t e, int world, const uint8_t* gathered,
                      int64_t msg_bytes, const float* scales, int64_t count, size_t tensor) {
  const int64_t c = t.padded / world;
  for (int64_t i = b; i < e;) {
    const int64_t j = i / c;
    const float s = scales[size_t(j) * size_t(count) + tensor];
    const uint8_t* bytes = gathered + j * msg_bytes + t.chunk_offset;
    const int64_t stop = std::min(e, (j + 1) * c);
    if (V::W >= 8) {
      for (; i + V::W <= stop && ((i - j * c) & 7) == 0; i += V::W)
        V::store(t.x + i, V::select(lane_bits<V>(bytes, i - j * c), V::set1(s), V::set1(-s)));
    }
    for (; i < stop; ++i) t.x[i] = chunk_bit(bytes, i - j * c) ? s : -s;
  }
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
