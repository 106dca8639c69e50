// The blockwise codecs of compressed ZeRO (docs/guides/compressed-zero.md
// "Codecs"). A run of n fp32 values is cut into blocks of `block` elements
// (the last one may be shorter); each block is stored as a record of fixed
// size: its fp32 scale s, then `block` payload fields (a short last block
// leaves the rest zero).
//
//   int8: s = fl(amax / 127), q = clamp(rint(fl(x / s)), -127, 127), x' = fl(q * s)
//         (when fl(127 s) overflows, s is the next float below: x' stays finite)
//   int4: s = fl(amax / 7),   q = clamp(rint(fl(x / s)), -7, 7), two per byte (s as for int8)
//         (element 2k in the low nibble), x' = fl(q * s)
//   sign: s = fl(mean |x|) (the sum in double, in element order), one bit per
//         element, set iff x < 0 (bit i%8 of byte i/8), x' = -s or s
//
// amax is the largest |x| of the block; s = 0 encodes every q as 0. A block
// holding Inf or NaN is stored with s = NaN and q = 0, so every decoded
// value of it is NaN: the receiver sees the non-finite gradient too.
// rint rounds half to even. With error feedback the encoded value is
// x = fl(g + fl(e * e_mul)) (e_mul: a power of two, 1 when the loss scale
// has not changed since e was made) and the residual becomes fl(x - x').
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "math/hd.hpp"

namespace dsopt {

enum class BlockCodec : int32_t { Int8 = 1, Int4 = 2, Sign = 3 };

DSOPT_ISA_BEGIN

DSOPT_HD int codec_bits(BlockCodec c) {
  return c == BlockCodec::Int8 ? 8 : c == BlockCodec::Int4 ? 4 : 1;
}
// Bytes of one block's record (block: a multiple of 8).
DSOPT_HD int64_t codec_record_bytes(BlockCodec c, int64_t block) {
  return 4 + block * codec_bits(c) / 8;
}
// Bytes of an encoded run of n elements.
DSOPT_HD int64_t codec_run_bytes(BlockCodec c, int64_t block, int64_t n) {
  return (n + block - 1) / block * codec_record_bytes(c, block);
}

DSOPT_HD float codec_input(const float* g, const float* e, float e_mul, int64_t i) {
  return e ? g[i] + e[i] * e_mul : g[i];
}

DSOPT_HD float codec_scale(BlockCodec c, const float* g, const float* e, float e_mul, int64_t len) {
  bool finite = true;
  float amax = 0.0f;
  double sum = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    const float x = codec_input(g, e, e_mul, i);
    if (!(std::fabs(x) <= 3.402823466e38f)) finite = false;
    const float a = std::fabs(x);
    if (a > amax) amax = a;
    sum += double(a);
  }
  if (!finite) {
    const uint32_t quiet_nan = 0x7fc00000u;
    float s;
    std::memcpy(&s, &quiet_nan, 4);
    return s;
  }
  if (c == BlockCodec::Sign) return len > 0 ? float(sum / double(len)) : 0.0f;
  const float limit = c == BlockCodec::Int8 ? 127.0f : 7.0f;
  float s = amax / limit;
  // Near FLT_MAX the rounded-up scale would decode the top level to Inf.
  if (!(limit * s <= 3.402823466e38f)) s = nextafterf(s, 0.0f);
  return s;
}

DSOPT_HD int codec_level(float x, float s, int limit) {
  if (!(s > 0.0f) || !(s <= 3.402823466e38f)) return 0;  // zero or NaN scale
  float q = rintf(x / s);
  if (q > float(limit)) q = float(limit);
  if (q < -float(limit)) q = -float(limit);
  return int(q);
}

// One block: len (<= block) values g (+ e e_mul) into `rec`; err (may
// alias e) receives x - x' when non-null.
DSOPT_HD void encode_block(BlockCodec c, int64_t block, const float* g, const float* e, float e_mul,
                           int64_t len, uint8_t* rec, float* err) {
  const float s = codec_scale(c, g, e, e_mul, len);
  std::memcpy(rec, &s, 4);
  uint8_t* payload = rec + 4;
  for (int64_t i = 0; i < block * codec_bits(c) / 8; ++i) payload[i] = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float x = codec_input(g, e, e_mul, i);
    float decoded;
    if (c == BlockCodec::Sign) {
      const bool negative = x < 0.0f;
      if (negative) payload[i / 8] = uint8_t(payload[i / 8] | (1u << (i % 8)));
      decoded = negative ? -s : s;
    } else {
      const int q = codec_level(x, s, c == BlockCodec::Int8 ? 127 : 7);
      if (c == BlockCodec::Int8) {
        payload[i] = uint8_t(int8_t(q));
      } else {
        const uint8_t nibble = uint8_t(q & 0xF);
        payload[i / 2] = uint8_t(payload[i / 2] | (i % 2 ? nibble << 4 : nibble));
      }
      decoded = float(q) * s;
    }
    if (err) err[i] = x - decoded;
  }
}

// Element i of a block's record.
DSOPT_HD float decode_element(BlockCodec c, const uint8_t* rec, int64_t i) {
  float s;
  std::memcpy(&s, rec, 4);
  const uint8_t* payload = rec + 4;
  if (c == BlockCodec::Sign) return (payload[i / 8] >> (i % 8)) & 1u ? -s : s;
  int q;
  if (c == BlockCodec::Int8) {
    q = int8_t(payload[i]);
  } else {
    const int nibble = (payload[i / 2] >> (i % 2 ? 4 : 0)) & 0xF;
    q = nibble >= 8 ? nibble - 16 : nibble;
  }
  return float(q) * s;
}

DSOPT_ISA_END

}  // namespace dsopt
