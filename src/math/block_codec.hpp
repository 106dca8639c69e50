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
// rint rounds half to even.
//
// Error feedback: the residual e of a run is itself an int8 run of the same
// blocks (its records: scale, then one level per element). The encoded
// value is x = fl(g + fl(e e_mul)) (e = fl(q s) decoded; e_mul a power of
// two, 1 when the loss scale has not changed since e was made), and the new
// residual is the int8 encoding of fl(x - x').
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "math/hd.hpp"
#include "math/scalar_ops.hpp"

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

// Every product and sum below is one rounding, never fused (ScalarOps).
using CodecOps = ScalarOps;

DSOPT_HD float quiet_nan() {
  const uint32_t bits = 0x7fc00000u;
  float s;
  std::memcpy(&s, &bits, 4);
  return s;
}

DSOPT_HD float record_scale(const uint8_t* rec) {
  float s;
  std::memcpy(&s, rec, 4);
  return s;
}

// The values a block is encoded from, element by element: x(i).
struct PlainValues {
  const float* g;
  DSOPT_HD float operator()(int64_t i) const { return g[i]; }
};
// With error feedback: x = fl(g + fl(e e_mul)), e = fl(q s_e) the residual
// (an int8 record: its scale s_e, read once, and its levels q).
struct FeedbackValues {
  const float* g;
  const uint8_t* e_levels;
  float e_scale, e_mul;
  DSOPT_HD float operator()(int64_t i) const {
    const float e = CodecOps::mul(float(int8_t(e_levels[i])), e_scale);
    return CodecOps::add(g[i], CodecOps::mul(e, e_mul));
  }
};
DSOPT_HD FeedbackValues feedback_values(const float* g, const uint8_t* e_rec, float e_mul) {
  return FeedbackValues{g, e_rec + 4, record_scale(e_rec), e_mul};
}

template <class X>
DSOPT_HD float codec_scale(BlockCodec c, const X& x, int64_t len) {
  int finite = 1;
  if (c == BlockCodec::Sign) {
    double sum = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      const float a = std::fabs(x(i));
      finite &= int(a <= 3.402823466e38f);
      sum += double(a);
    }
    if (!finite) return quiet_nan();
    return len > 0 ? float(sum / double(len)) : 0.0f;
  }
  // The largest |x| as the largest magnitude bit pattern, which orders
  // non-negative floats as their values and puts Inf and NaN above FLT_MAX
  // (an integer reduction, so the loop vectorizes).
  uint32_t top = 0;
  for (int64_t i = 0; i < len; ++i) {
    const float v = x(i);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0x7fffffffu;
    top = bits > top ? bits : top;
  }
  if (top > 0x7f7fffffu) return quiet_nan();
  float amax;
  std::memcpy(&amax, &top, 4);
  const float limit = c == BlockCodec::Int8 ? 127.0f : 7.0f;
  float s = amax / limit;
  // Near FLT_MAX the rounded-up scale would decode the top level to Inf.
  if (!(limit * s <= 3.402823466e38f)) s = nextafterf(s, 0.0f);
  return s;
}

// rint(t) for |t| < 2^22 in round-to-nearest-even: adding 1.5 * 2^23
// leaves no fraction bits, and subtracting it again is exact. (Inline
// arithmetic instead of a libm call, so the element loops vectorize.)
DSOPT_HD float round_even(float t) {
  const float magic = 12582912.0f;
  return (t + magic) - magic;
}

// The level of x at a usable scale s (0 < s <= FLT_MAX): |x / s| stays
// below 2 * limit + 1 because s >= amax / limit up to its rounding, even
// for denormal scales.
DSOPT_HD int codec_level(float x, float s, float limit) {
  float q = round_even(CodecOps::div(x, s));
  q = q > limit ? limit : q;
  q = q < -limit ? -limit : q;
  return int(q);
}

// One block: the len (<= block) values x(0..len) into the record `rec`.
// Reads x twice (the scale, then the levels) and writes rec only after
// the first pass.
template <class X>
DSOPT_HD void encode_values(BlockCodec c, int64_t block, const X& x, int64_t len, uint8_t* rec) {
  const float s = codec_scale(c, x, len);
  std::memcpy(rec, &s, 4);
  uint8_t* payload = rec + 4;
  const int64_t payload_bytes = block * codec_bits(c) / 8;
  int64_t written = 0;  // payload bytes set below; the rest are zero
  // Whole bytes first (a fixed inner loop that unrolls), then the last
  // byte's elements: the main loops have no branch and vectorize.
  if (c == BlockCodec::Sign) {
    for (int64_t b = 0; b < len / 8; ++b) {
      unsigned bits = 0;
      for (int j = 0; j < 8; ++j) bits |= unsigned(x(b * 8 + j) < 0.0f) << j;
      payload[b] = uint8_t(bits);
    }
    written = len / 8;
    if (len % 8) {
      unsigned bits = 0;
      for (int64_t i = written * 8; i < len; ++i) bits |= unsigned(x(i) < 0.0f) << (i % 8);
      payload[written++] = uint8_t(bits);
    }
  } else if (s > 0.0f && s <= 3.402823466e38f) {
    // (A zero or NaN scale encodes every level as 0, x' = 0 or NaN: the
    // payload stays zero.)
    const float limit = c == BlockCodec::Int8 ? 127.0f : 7.0f;
    if (c == BlockCodec::Int8) {
      for (int64_t i = 0; i < len; ++i) payload[i] = uint8_t(int8_t(codec_level(x(i), s, limit)));
      written = len;
    } else {
      for (int64_t b = 0; b < len / 2; ++b) {
        const int q0 = codec_level(x(2 * b), s, limit);
        const int q1 = codec_level(x(2 * b + 1), s, limit);
        payload[b] = uint8_t((q0 & 0xF) | ((q1 & 0xF) << 4));
      }
      written = len / 2;
      if (len % 2) payload[written++] = uint8_t(codec_level(x(len - 1), s, limit) & 0xF);
    }
  }
  for (int64_t i = written; i < payload_bytes; ++i) payload[i] = 0;
}

// The level of a 4-bit code (a nibble, two's complement): (n ^ 8) - 8.
DSOPT_HD int int4_level(unsigned nibble) { return int(nibble ^ 8u) - 8; }

// The code of element i of a block's payload.
DSOPT_HD int codec_code(BlockCodec c, const uint8_t* payload, int64_t i) {
  if (c == BlockCodec::Sign) return (payload[i / 8] >> (i % 8)) & 1;
  if (c == BlockCodec::Int8) return int8_t(payload[i]);
  return int4_level((payload[i / 2] >> (i % 2 ? 4 : 0)) & 0xFu);
}

// The value of code q under scale s: q s, or for a sign code s with its
// sign bit flipped when q is 1 (which is -s, NaN included), a bit
// operation that vectorizes.
DSOPT_HD float decode_code(BlockCodec c, int q, float s) {
  if (c != BlockCodec::Sign) return CodecOps::mul(float(q), s);
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  bits ^= uint32_t(q) << 31;
  float d;
  std::memcpy(&d, &bits, 4);
  return d;
}

// What encoding lost at one element: fl(x - x') as x + (-x').
DSOPT_HD float lost_value(float x, float decoded) { return CodecOps::add(x, -decoded); }

// Element i of a block's record.
DSOPT_HD float decode_element(BlockCodec c, const uint8_t* rec, int64_t i) {
  float s;
  std::memcpy(&s, rec, 4);
  return decode_code(c, codec_code(c, rec + 4, i), s);
}

// What encoding x into `rec` (scale s) lost: fl(x(i) - x'(i)).
template <class X>
struct LostValues {
  X x;
  BlockCodec c;
  const uint8_t* rec;
  float s;
  DSOPT_HD float operator()(int64_t i) const {
    return lost_value(x(i), decode_code(c, codec_code(c, rec + 4, i), s));
  }
};

// One block of x into `rec`; with e_out, the residual's int8 record of
// what it lost (e_out may be the record x reads its residual from: each
// of its elements is read before it is written).
template <class X>
DSOPT_HD void encode_block(BlockCodec c, int64_t block, const X& x, int64_t len, uint8_t* rec,
                           uint8_t* e_out) {
  encode_values(c, block, x, len, rec);
  if (e_out)
    encode_values(BlockCodec::Int8, block, LostValues<X>{x, c, rec, record_scale(rec)}, len, e_out);
}

// The same from g and, when e_rec is non-null, its residual record.
DSOPT_HD void encode_block(BlockCodec c, int64_t block, const float* g, const uint8_t* e_rec,
                           float e_mul, int64_t len, uint8_t* rec, uint8_t* e_out) {
  if (e_rec)
    encode_block(c, block, feedback_values(g, e_rec, e_mul), len, rec, e_out);
  else
    encode_block(c, block, PlainValues{g}, len, rec, e_out);
}

// The len decoded values of a block's record into dst (add: dst += them,
// one fp32 rounding each), the scale read once.
DSOPT_HD void decode_block(BlockCodec c, const uint8_t* rec, int64_t len, float* dst, bool add) {
  float s;
  std::memcpy(&s, rec, 4);
  const uint8_t* payload = rec + 4;
  if (c == BlockCodec::Int8) {
    for (int64_t i = 0; i < len; ++i) {
      const float d = CodecOps::mul(float(int8_t(payload[i])), s);
      dst[i] = add ? CodecOps::add(dst[i], d) : d;
    }
    return;
  }
  // int4 and sign: whole bytes (2 or 8 elements each, a fixed inner loop
  // that unrolls and vectorizes), then the last byte's elements.
  const int per_byte = c == BlockCodec::Int4 ? 2 : 8;
  const int64_t whole = len / per_byte;
  const auto code_value = [&](unsigned byte, int j) {
    return decode_code(c, c == BlockCodec::Int4 ? int4_level((byte >> (4 * j)) & 0xFu) : int((byte >> j) & 1u), s);
  };
  if (c == BlockCodec::Int4) {
    for (int64_t b = 0; b < whole; ++b)
      for (int j = 0; j < 2; ++j) {
        const float d = code_value(payload[b], j);
        dst[2 * b + j] = add ? CodecOps::add(dst[2 * b + j], d) : d;
      }
  } else {
    for (int64_t b = 0; b < whole; ++b)
      for (int j = 0; j < 8; ++j) {
        const float d = code_value(payload[b], j);
        dst[8 * b + j] = add ? CodecOps::add(dst[8 * b + j], d) : d;
      }
  }
  for (int64_t i = whole * per_byte; i < len; ++i) {
    const float d = code_value(payload[i / per_byte], int(i % per_byte));
    dst[i] = add ? CodecOps::add(dst[i], d) : d;
  }
}

// What encoding the len values x into `rec` lost, for the whole block
// into `lost`: the record decoded once, then lost_value (LostValues gives
// the same element by element).
DSOPT_HD void lost_values(BlockCodec c, const float* x, const uint8_t* rec, int64_t len, float* lost) {
  decode_block(c, rec, len, lost, false);
  for (int64_t i = 0; i < len; ++i) lost[i] = lost_value(x[i], lost[i]);
}

DSOPT_ISA_END

}  // namespace dsopt
