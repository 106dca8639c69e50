// The CPU loops of the gradient pass and the conversions, written once
// against a vector type V (VecScalar, VecAvx2, VecAvx512): whole vectors
// first, then the tail one element at a time with the same math
// (VecScalar), so every element gets the same bits. The update rules' loop
// is update_loop.hpp.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_isa.hpp"
#include "kernels/cpu/dtype_io.hpp"
#include "kernels/cpu/lane_sums.hpp"
#include "kernels/cpu/vec_scalar.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

namespace cpu {

// ---- gradient transform -----------------------------------------------------

// y = fl(x * mul) (dst = fl(dst + y) with `add`) over S sum blocks at
// once, each block's sum of squares of the values written taken on the way
// (LaneSums): the pass reads x once and writes dst only when there is one.
// S > 1: S whole blocks, block q starting `stride` blocks after block q - 1
// (the first at `begin`), read side by side as S streams (one stream per
// core leaves most of the memory system's parallelism unused); S == 1: one
// block [begin, end) of any length, its tail element by element. dst[0] is
// element `begin`; block_sums (may be null) receives block q's sum at
// block_sums[q * stride].
template <class V, DType T, int S>
bool transform_blocks_t(const TensorRef& t, int64_t begin, int64_t end, int64_t stride, float mul,
                        float* dst, bool add, double* block_sums) {
  using F = typename V::F;
  LaneSums sums[S];
  // x * 0 is NaN exactly when x is Inf or NaN; the sum keeps any NaN.
  F bad = V::set1(0.0f);
  float bad_tail = 0.0f;
  const F zero = V::set1(0.0f), vmul = V::set1(mul);
  const int64_t len = S == 1 ? end - begin : kSumBlock;
  int64_t j = 0;
  for (; j + V::W <= len; j += V::W) {
    for (int q = 0; q < S; ++q) {
      const int64_t o = q * stride * kSumBlock + j;  // from `begin`
      const F x = load<V, T>(t.data, begin + o);
      bad = V::add(bad, V::mul(x, zero));
      F y = V::mul(x, vmul);
      if (dst) {
        if (add) y = V::add(V::load(dst + o), y);
        V::store(dst + o, y);
      }
      if (block_sums) sums[q].template add<V>(j, y);
    }
  }
  if constexpr (S == 1) {
    for (; j < len; ++j) {
      const float x = load<VecScalar, T>(t.data, begin + j);
      bad_tail = bad_tail + x * 0.0f;
      float y = x * mul;
      if (dst) {
        if (add) y = dst[j] + y;
        dst[j] = y;
      }
      if (block_sums) sums[0].template add<VecScalar>(j, y);
    }
  }
  if (block_sums)
    for (int q = 0; q < S; ++q) block_sums[q * stride] = sums[q].total();
  return V::any_nan(bad) || bad_tail != bad_tail;
}

// Streams read side by side by transform_blocks.
constexpr int kTransformStreams = 8;

// The sum blocks of [begin, end) (begin on a block boundary): the whole
// blocks cut into kTransformStreams runs of equal length, read as that many
// streams (the i-th block of every run at once), then the rest one by one.
// Long streams keep more of the memory system busy than adjacent blocks do.
template <class V, DType T>
bool transform_blocks_dt(const TensorRef& t, int64_t begin, int64_t end, float mul, float* dst,
                         bool add, double* block_sums) {
  constexpr int S = kTransformStreams;
  const int64_t per = (end - begin) / kSumBlock / S;  // blocks per stream
  bool bad = false;
  for (int64_t i = 0; i < per; ++i) {
    const int64_t b = begin + i * kSumBlock;
    bad |= transform_blocks_t<V, T, S>(t, b, b + kSumBlock, per, mul, dst ? dst + (b - begin) : nullptr,
                                       add, block_sums ? block_sums + i : nullptr);
  }
  for (int64_t b = begin + S * per * kSumBlock, k = S * per; b < end; ++k) {
    const int64_t e = std::min(end, b + kSumBlock);
    bad |= transform_blocks_t<V, T, 1>(t, b, e, 1, mul, dst ? dst + (b - begin) : nullptr, add,
                                       block_sums ? block_sums + k : nullptr);
    b = e;
  }
  return bad;
}

// Whether x[begin, end) holds an Inf or NaN (x * 0 is NaN exactly then).
// A long range is read as four streams at once, each a quarter of it: one
// stream per core leaves most of the memory system's parallelism unused,
// and this pass only reads. Short ranges (small tensors, usually back to
// back in memory) are one stream, which the prefetchers follow across them.
constexpr int64_t kCheckStreamsFrom = int64_t(1) << 16;

template <class V, DType T>
bool check_range_t(const TensorRef& t, int64_t begin, int64_t end) {
  using F = typename V::F;
  const int64_t n = end - begin;
  const int64_t quarter = n >= kCheckStreamsFrom ? n / (4 * V::W) * V::W : 0;
  const int64_t q1 = begin + quarter, q2 = q1 + quarter, q3 = q2 + quarter;
  const F zero = V::set1(0.0f);
  F b0 = zero, b1 = zero, b2 = zero, b3 = zero;
  for (int64_t j = 0; j < quarter; j += V::W) {
    b0 = V::add(b0, V::mul(load<V, T>(t.data, begin + j), zero));
    b1 = V::add(b1, V::mul(load<V, T>(t.data, q1 + j), zero));
    b2 = V::add(b2, V::mul(load<V, T>(t.data, q2 + j), zero));
    b3 = V::add(b3, V::mul(load<V, T>(t.data, q3 + j), zero));
  }
  int64_t i = q3 + quarter;
  for (; i + 2 * V::W <= end; i += 2 * V::W) {
    b0 = V::add(b0, V::mul(load<V, T>(t.data, i), zero));
    b1 = V::add(b1, V::mul(load<V, T>(t.data, i + V::W), zero));
  }
  for (; i + V::W <= end; i += V::W) b2 = V::add(b2, V::mul(load<V, T>(t.data, i), zero));
  float tail = 0.0f;
  for (; i < end; ++i) tail = tail + load<VecScalar, T>(t.data, i) * 0.0f;
  return V::any_nan(V::add(V::add(b0, b1), V::add(b2, b3))) || tail != tail;
}

template <class V>
bool check_range(const TensorRef& t, int64_t begin, int64_t end) {
  switch (t.dtype) {
    case DType::F32: return check_range_t<V, DType::F32>(t, begin, end);
    case DType::F16: return check_range_t<V, DType::F16>(t, begin, end);
    case DType::BF16: return check_range_t<V, DType::BF16>(t, begin, end);
  }
  return false;
}

template <class V>
bool transform_blocks(const TensorRef& t, int64_t begin, int64_t end, float mul, float* dst,
                      bool add, double* block_sums) {
  switch (t.dtype) {
    case DType::F32: return transform_blocks_dt<V, DType::F32>(t, begin, end, mul, dst, add, block_sums);
    case DType::F16: return transform_blocks_dt<V, DType::F16>(t, begin, end, mul, dst, add, block_sums);
    case DType::BF16: return transform_blocks_dt<V, DType::BF16>(t, begin, end, mul, dst, add, block_sums);
  }
  return false;
}

// ---- conversions ------------------------------------------------------------

template <class V, DType T>
void from_float_t(const float* src, void* dst, int64_t i, int64_t end) {
  for (; i + V::W <= end; i += V::W) store<V, T>(dst, i, V::load(src + i));
  for (; i < end; ++i) store<VecScalar, T>(dst, i, src[i]);
}

template <class V>
void from_float_range(const float* src, void* dst, DType dtype, int64_t b, int64_t e) {
  switch (dtype) {
    case DType::F32: return from_float_t<V, DType::F32>(src, dst, b, e);
    case DType::F16: return from_float_t<V, DType::F16>(src, dst, b, e);
    case DType::BF16: return from_float_t<V, DType::BF16>(src, dst, b, e);
  }
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
