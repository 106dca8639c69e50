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

// y = fl(x * mul) (dst = fl(dst + y) with `add`) over S sum blocks read
// side by side as S streams (one stream per core leaves most of the memory
// system's parallelism unused), block q being b[q * stride]; each block's
// sum of squares of the values written taken on the way (LaneSums) into its
// `sum`. The whole vectors of every block are read together while the
// blocks have them, then each block's tail element by element with the
// same math (VecScalar), so every element gets the same bits. The blocks
// have a dst all or none, and a sum all or none.
template <class V, DType T, int S>
bool transform_streams(const PassBlock* b, int64_t stride, float mul, bool add) {
  using F = typename V::F;
  const size_t elem = dtype_size(T);
  LaneSums lanes[S];
  const void* x[S];
  float* dst[S];
  int64_t len[S];
  int64_t common = kSumBlock;
  for (int q = 0; q < S; ++q) {
    const PassBlock& p = b[q * stride];
    x[q] = static_cast<const char*>(p.src) + size_t(p.begin) * elem;
    dst[q] = p.dst;
    len[q] = p.len;
    common = std::min(common, p.len);
  }
  const bool write = dst[0] != nullptr, sums = b[0].sum != nullptr;
  // x * 0 is NaN exactly when x is Inf or NaN; the sum keeps any NaN.
  F bad = V::set1(0.0f);
  float bad_tail = 0.0f;
  const F zero = V::set1(0.0f), vmul = V::set1(mul);
  const auto vector_at = [&](int q, int64_t j) {
    const F v = load<V, T>(x[q], j);
    bad = V::add(bad, V::mul(v, zero));
    F y = V::mul(v, vmul);
    if (write) {
      if (add) y = V::add(V::load(dst[q] + j), y);
      V::store(dst[q] + j, y);
    }
    if (sums) lanes[q].template add<V>(j, y);
  };
  int64_t j = 0;
  for (; j + V::W <= common; j += V::W)
    for (int q = 0; q < S; ++q) vector_at(q, j);
  // The whole vectors past the common part: the streams that have some
  // still read together, up to the shortest of them, until none is left.
  int active[S], count = 0;
  for (int q = 0; q < S; ++q)
    if (len[q] - j >= V::W) active[count++] = q;
  while (count > 0) {
    int64_t stop = kSumBlock;
    for (int a = 0; a < count; ++a) stop = std::min(stop, len[active[a]] / V::W * V::W);
    for (; j < stop; j += V::W)
      for (int a = 0; a < count; ++a) vector_at(active[a], j);
    int kept = 0;
    for (int a = 0; a < count; ++a)
      if (len[active[a]] - j >= V::W) active[kept++] = active[a];
    count = kept;
  }
  for (int q = 0; q < S; ++q) {
    for (int64_t k = len[q] / V::W * V::W; k < len[q]; ++k) {
      const float v = load<VecScalar, T>(x[q], k);
      bad_tail = bad_tail + v * 0.0f;
      float y = v * mul;
      if (write) {
        if (add) y = dst[q][k] + y;
        dst[q][k] = y;
      }
      if (sums) lanes[q].template add<VecScalar>(k, y);
    }
    if (sums) *b[q * stride].sum = lanes[q].total();
  }
  return V::any_nan(bad) || bad_tail != bad_tail;
}

// Streams read side by side by transform_streams.
constexpr int kTransformStreams = 8;

// `count` sum blocks cut into kTransformStreams runs of equal length, read
// as that many streams (the i-th block of every run at once), then the rest
// one by one. The blocks of one long tensor make long streams, and so do
// many small tensors back to back in memory, a block each; either keeps
// more of the memory system busy than one block at a time does.
template <class V, DType T>
bool transform_blocks_dt(const PassBlock* blocks, int64_t count, float mul, bool add) {
  constexpr int S = kTransformStreams;
  const int64_t per = count / S;  // blocks per stream
  bool bad = false;
  for (int64_t i = 0; i < per; ++i) bad |= transform_streams<V, T, S>(blocks + i, per, mul, add);
  for (int64_t k = S * per; k < count; ++k) bad |= transform_streams<V, T, 1>(blocks + k, 1, mul, add);
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
bool transform_blocks(DType dtype, const PassBlock* blocks, int64_t count, float mul, bool add) {
  switch (dtype) {
    case DType::F32: return transform_blocks_dt<V, DType::F32>(blocks, count, mul, add);
    case DType::F16: return transform_blocks_dt<V, DType::F16>(blocks, count, mul, add);
    case DType::BF16: return transform_blocks_dt<V, DType::BF16>(blocks, count, mul, add);
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
