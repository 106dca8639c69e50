// The CPU loops, written once against a vector type V (VecScalar, VecAvx2,
// VecAvx512): whole vectors first, then the tail one element at a time with
// the same math (VecScalar), so every element gets the same bits.
#pragma once
#include <algorithm>
#include <cstdint>

#include "kernels/cpu/cpu_isa.hpp"
#include "kernels/cpu/vec_scalar.hpp"
#include "math/adam.hpp"
#include "math/onebit_adam.hpp"
#include "math/onebit_lamb.hpp"
#include "math/sum_squares.hpp"
#include "math/zero_one_adam.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN

namespace cpu {

template <class V, DType T>
inline typename V::F load(const void* base, int64_t i) {
  if constexpr (T == DType::F32) return V::load(static_cast<const float*>(base) + i);
  else if constexpr (T == DType::F16) return V::load_f16(static_cast<const uint16_t*>(base) + i);
  else return V::load_bf16(static_cast<const uint16_t*>(base) + i);
}

template <class V, DType T>
inline void store(void* base, int64_t i, typename V::F x) {
  if constexpr (T == DType::F32) V::store(static_cast<float*>(base) + i, x);
  else if constexpr (T == DType::F16) V::store_f16(static_cast<uint16_t*>(base) + i, x);
  else V::store_bf16(static_cast<uint16_t*>(base) + i, x);
}

// ---- the Adam-family update rules --------------------------------------------

constexpr bool reads_grad(UpdateRule r) {
  return r != UpdateRule::OneBitApply && r != UpdateRule::LambCompressed &&
         r != UpdateRule::LambApply && r != UpdateRule::ZeroOneGradientPrepare &&
         r != UpdateRule::ZeroOneSyncPrepare && r != UpdateRule::ZeroOneSyncApply;
}

// The 1-bit LAMB rules: loads and stores around math/onebit_lamb.hpp.
template <UpdateRule R, class V, DType G>
inline void lamb_rule_at(const AdamSlot& s, int64_t i, const AdamConsts& c, typename V::F mul1,
                         typename V::F mul2) {
  using F = typename V::F;
  if constexpr (R == UpdateRule::LambApply) {
    F p = V::load(s.master + i);
    lamb_apply<V>(p, V::load(s.u + i), c);
    V::store(s.master + i, p);
    return;
  } else if constexpr (R == UpdateRule::LambCompressed) {
    F m = V::load(s.m + i), vf = V::load(s.vf + i), u0, u, ratio;
    const F mask = s.mask ? V::load(s.mask + i) : V::set1(1.0f);
    lamb_compressed<V>(V::load(s.master + i), m, V::load(s.aux + i), mask, V::load(s.v + i), vf,
                       u0, u, ratio, c);
    V::store(s.m + i, m);
    V::store(s.vf + i, vf);
    V::store(s.aux + i, u0);
    V::store(s.u + i, u);
    V::store(s.ratio + i, ratio);
  } else {
    const F g = V::mul(V::mul(load<V, G>(s.grad, i), mul1), mul2);
    F m = V::load(s.m + i);
    if constexpr (R == UpdateRule::LambMomentum) {
      F m_prev;
      const F v = c.update_units ? V::load(s.v + i) : V::set1(0.0f);  // read only where used
      lamb_momentum<V>(m, m_prev, v, g, c);
      V::store(s.aux + i, m_prev);
    } else {
      F v = V::load(s.v + i), u;
      lamb_warmup<V>(V::load(s.master + i), m, v, u, g, c);
      V::store(s.v + i, v);
      V::store(s.u + i, u);
    }
    V::store(s.m + i, m);
  }
}

// P16 == F32 means "no 16-bit parameter to write back".
template <UpdateRule R, class V, DType G, DType P16>
inline void rule_at(const AdamSlot& s, int64_t i, const AdamConsts& c, typename V::F mul1,
                    typename V::F mul2) {
  using F = typename V::F;
  if constexpr (R == UpdateRule::LambWarmup || R == UpdateRule::LambMomentum ||
                R == UpdateRule::LambCompressed || R == UpdateRule::LambApply) {
    lamb_rule_at<R, V, G>(s, i, c, mul1, mul2);
    if constexpr (R == UpdateRule::LambApply && P16 != DType::F32)
      store<V, P16>(s.param16, i, V::load(s.master + i));
    return;
  }
  if constexpr (R == UpdateRule::ZeroOneSyncPrepare || R == UpdateRule::ZeroOneGradientPrepare) {
    F acc = V::load(s.acc + i);
    if constexpr (R == UpdateRule::ZeroOneSyncPrepare) zoadam_sync_prepare<V>(acc, V::load(s.v + i), c);
    else acc = onebit_to_update_units<V>(acc, V::load(s.v + i), c);
    V::store(s.acc + i, acc);
    return;  // the parameter waits for the compressed allreduce
  }
  F p = V::load(s.master + i), m = V::load(s.m + i);
  if constexpr (R == UpdateRule::OneBitApply) {
    const F v = V::load(s.v + i);
    if (c.update_units) m = onebit_from_update_units<V>(m, v, c);
    if (s.mask) m = V::mul(m, V::load(s.mask + i));
    if (s.mask || c.update_units) V::store(s.m + i, m);
    onebit_apply<V>(p, m, v, c);
  } else if constexpr (R == UpdateRule::ZeroOneSyncApply) {
    const F v = V::load(s.v + i);
    F acc = V::load(s.acc + i);
    if (c.update_units) acc = onebit_from_update_units<V>(acc, v, c);
    if (s.mask) acc = V::mul(acc, V::load(s.mask + i));
    zoadam_sync_apply<V>(p, m, v, acc, V::load(s.anchor + i), c);
    V::store(s.m + i, m);
    V::store(s.anchor + i, p);
    V::store(s.acc + i, V::set1(0.0f));
  } else {
    F g = V::mul(V::mul(load<V, G>(s.grad, i), mul1), mul2);
    if constexpr (R == UpdateRule::OneBitMomentum) {
      onebit_momentum<V>(m, g, c);
      if (c.update_units) m = onebit_to_update_units<V>(m, V::load(s.v + i), c);
      V::store(s.m + i, m);
      return;  // the parameter waits for the compressed allreduce
    } else if constexpr (R == UpdateRule::ZeroOneGradient) {
      const F v = V::load(s.v + i);
      if (c.update_units) g = onebit_from_update_units<V>(g, v, c);
      if (s.mask) g = V::mul(g, V::load(s.mask + i));
      zoadam_gradient<V>(p, m, v, g, c);
      V::store(s.m + i, m);
    } else if constexpr (R == UpdateRule::ZeroOneLocal) {
      F acc = V::load(s.acc + i);
      zoadam_local<V>(p, m, V::load(s.v + i), acc, g, c);
      V::store(s.m + i, m);
      V::store(s.acc + i, acc);
    } else {
      F v = V::load(s.v + i);
      if constexpr (R == UpdateRule::Adam) adam_update<V>(p, m, v, g, c);
      else onebit_warmup<V>(p, m, v, g, c);
      V::store(s.m + i, m);
      V::store(s.v + i, v);
    }
  }
  V::store(s.master + i, p);
  if constexpr (P16 != DType::F32) store<V, P16>(s.param16, i, p);
}

// Copies n elements and zero-fills the rest of a W-element stage.
template <int W, class T>
inline T* stage_in(T* stage, const T* src, int64_t n) {
  for (int64_t k = 0; k < n; ++k) stage[k] = src[k];
  for (int64_t k = n; k < W; ++k) stage[k] = T(0);
  return stage;
}
template <class T>
inline void stage_out(T* dst, const T* stage, int64_t n) {
  for (int64_t k = 0; k < n; ++k) dst[k] = stage[k];
}

// The last n < V::W elements of a range, starting at element i, through
// one full vector: every stream of the slot staged into a W-element buffer
// (zeros past n), the rule applied there, the slot's writable streams copied
// back. Vector lanes compute what VecScalar computes, so the bits are those
// of an element-by-element loop, at a fraction of its cost (tensors of a
// few hundred elements spend much of their time in their tails otherwise).
template <UpdateRule R, class V, DType G, DType P16>
void rule_tail(const AdamSlot& s, int64_t i, int64_t n, const AdamConsts& c, typename V::F vm1,
               typename V::F vm2) {
  constexpr int W = V::W;
  alignas(64) float stage[11][W];
  alignas(64) uint16_t stage16[W], grad16[W];
  AdamSlot t = s;
  int used = 0;
  float** writable[] = {&t.master, &t.m, &t.v, &t.vf, &t.u, &t.aux, &t.ratio, &t.acc, &t.anchor};
  for (float** field : writable)
    if (*field) *field = stage_in<W>(stage[used++], *field + i, n);
  if (s.mask) t.mask = stage_in<W>(stage[used++], s.mask + i, n);
  if (reads_grad(R) && s.grad) {
    if constexpr (G == DType::F32)
      t.grad = stage_in<W>(stage[used++], static_cast<const float*>(s.grad) + i, n);
    else
      t.grad = stage_in<W>(grad16, static_cast<const uint16_t*>(s.grad) + i, n);
  }
  if constexpr (P16 != DType::F32) t.param16 = stage16;
  rule_at<R, V, G, P16>(t, 0, c, vm1, vm2);
  int k = 0;
  float* const originals[] = {s.master, s.m, s.v, s.vf, s.u, s.aux, s.ratio, s.acc, s.anchor};
  for (float* ptr : originals)
    if (ptr) stage_out(ptr + i, stage[k++], n);
  if constexpr (P16 != DType::F32) stage_out(static_cast<uint16_t*>(s.param16) + i, stage16, n);
}

template <UpdateRule R, class V, DType G, DType P16>
void rule_range(const AdamSlot& s, int64_t i, int64_t end, const AdamConsts& c, float mul1,
                float mul2) {
  const typename V::F vm1 = V::set1(mul1), vm2 = V::set1(mul2);
  for (; i + V::W <= end; i += V::W) rule_at<R, V, G, P16>(s, i, c, vm1, vm2);
  // A short tail is cheaper element by element than staged.
  if (end - i >= V::W / 4) {
    rule_tail<R, V, G, P16>(s, i, end - i, c, vm1, vm2);
    return;
  }
  for (; i < end; ++i) rule_at<R, VecScalar, G, P16>(s, i, c, mul1, mul2);
}

template <UpdateRule R, class V, DType G>
void rule_range_g(const AdamSlot& s, int64_t b, int64_t e, const AdamConsts& c, float m1,
                  float m2) {
  if (!s.param16) rule_range<R, V, G, DType::F32>(s, b, e, c, m1, m2);
  else if (s.param16_dtype == DType::F16) rule_range<R, V, G, DType::F16>(s, b, e, c, m1, m2);
  else rule_range<R, V, G, DType::BF16>(s, b, e, c, m1, m2);
}

template <UpdateRule R, class V>
void rule_range_r(const AdamSlot& s, int64_t b, int64_t e, const AdamConsts& c, float m1,
                  float m2) {
  if constexpr (!reads_grad(R)) {
    rule_range_g<R, V, DType::F32>(s, b, e, c, m1, m2);
  } else {
    switch (s.grad_dtype) {
      case DType::F32: return rule_range_g<R, V, DType::F32>(s, b, e, c, m1, m2);
      case DType::F16: return rule_range_g<R, V, DType::F16>(s, b, e, c, m1, m2);
      case DType::BF16: return rule_range_g<R, V, DType::BF16>(s, b, e, c, m1, m2);
    }
  }
}

template <class V>
void update_range(UpdateRule rule, const AdamSlot& s, int64_t b, int64_t e, const AdamConsts& c,
                  float m1, float m2) {
  switch (rule) {
    case UpdateRule::Adam: return rule_range_r<UpdateRule::Adam, V>(s, b, e, c, m1, m2);
    case UpdateRule::OneBitWarmup: return rule_range_r<UpdateRule::OneBitWarmup, V>(s, b, e, c, m1, m2);
    case UpdateRule::OneBitMomentum: return rule_range_r<UpdateRule::OneBitMomentum, V>(s, b, e, c, m1, m2);
    case UpdateRule::OneBitApply: return rule_range_r<UpdateRule::OneBitApply, V>(s, b, e, c, m1, m2);
    case UpdateRule::LambWarmup: return rule_range_r<UpdateRule::LambWarmup, V>(s, b, e, c, m1, m2);
    case UpdateRule::LambMomentum: return rule_range_r<UpdateRule::LambMomentum, V>(s, b, e, c, m1, m2);
    case UpdateRule::LambCompressed: return rule_range_r<UpdateRule::LambCompressed, V>(s, b, e, c, m1, m2);
    case UpdateRule::LambApply: return rule_range_r<UpdateRule::LambApply, V>(s, b, e, c, m1, m2);
    case UpdateRule::ZeroOneGradient: return rule_range_r<UpdateRule::ZeroOneGradient, V>(s, b, e, c, m1, m2);
    case UpdateRule::ZeroOneLocal: return rule_range_r<UpdateRule::ZeroOneLocal, V>(s, b, e, c, m1, m2);
    case UpdateRule::ZeroOneGradientPrepare: return rule_range_r<UpdateRule::ZeroOneGradientPrepare, V>(s, b, e, c, m1, m2);
    case UpdateRule::ZeroOneSyncPrepare: return rule_range_r<UpdateRule::ZeroOneSyncPrepare, V>(s, b, e, c, m1, m2);
    case UpdateRule::ZeroOneSyncApply: return rule_range_r<UpdateRule::ZeroOneSyncApply, V>(s, b, e, c, m1, m2);
  }
}

// ---- gradient transform -----------------------------------------------------

// Sum of squares of y[0..n) in the order of math/sum_squares.hpp (n <= kSumBlock).
inline double block_sum_squares(const float* y, int64_t n) {
  double lanes[kSumLanes] = {};
  for (int64_t k = 0; k < n; k += kSumLanes) {
    const int64_t m = std::min<int64_t>(kSumLanes, n - k);
    for (int64_t j = 0; j < m; ++j) lanes[j] += double(y[k + j]) * double(y[k + j]);
  }
  sum_lanes_tree(lanes);
  return lanes[0];
}

template <class V, DType T>
bool transform_block_t(const TensorRef& t, int64_t begin, int64_t end, float mul, float* dst,
                       bool add, double* block_sum) {
  using F = typename V::F;
  float scratch[kSumBlock];
  float* y = dst ? dst : scratch;
  // x * 0 is NaN exactly when x is Inf or NaN; the sum keeps any NaN.
  F bad = V::set1(0.0f);
  float bad_tail = 0.0f;
  const F zero = V::set1(0.0f), vmul = V::set1(mul);
  int64_t i = begin;
  for (; i + V::W <= end; i += V::W) {
    const F x = load<V, T>(t.data, i);
    bad = V::add(bad, V::mul(x, zero));
    const F v = V::mul(x, vmul);
    V::store(y + (i - begin), add ? V::add(V::load(y + (i - begin)), v) : v);
  }
  for (; i < end; ++i) {
    const float x = load<VecScalar, T>(t.data, i);
    bad_tail = bad_tail + x * 0.0f;
    y[i - begin] = add ? y[i - begin] + x * mul : x * mul;
  }
  if (block_sum) *block_sum = block_sum_squares(y, end - begin);
  return V::any_nan(bad) || bad_tail != bad_tail;
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
bool transform_block(const TensorRef& t, int64_t begin, int64_t end, float mul, float* dst,
                     bool add, double* block_sum) {
  switch (t.dtype) {
    case DType::F32: return transform_block_t<V, DType::F32>(t, begin, end, mul, dst, add, block_sum);
    case DType::F16: return transform_block_t<V, DType::F16>(t, begin, end, mul, dst, add, block_sum);
    case DType::BF16: return transform_block_t<V, DType::BF16>(t, begin, end, mul, dst, add, block_sum);
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
