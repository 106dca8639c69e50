// The sum of squares of one sum block in the order of math/sum_squares.hpp,
// taken as the values are produced: element k of the block (k counted from
// the block's start) goes to lane k % kSumLanes, and the elements arrive in
// increasing k, so every lane adds its squares in the fixed order whatever
// the vector width. A whole vector of V::W values starting at a multiple of
// V::W (which divides kSumLanes) fills V::W adjacent lanes with one fused
// multiply-add per double vector: squares of floats are exact in double, so
// it rounds as the scalar `lane += x * x` does.
#pragma once
#include <cstdint>

#include "kernels/cpu/vec_scalar.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN
namespace cpu {

class LaneSums {
 public:
  // Block element k .. k + V::W - 1 (k a multiple of V::W).
  template <class V>
  void add(int64_t k, typename V::F y) {
    V::add_squares(lanes_ + (k & (kSumLanes - 1)), y);
  }
  // The lanes combined by the fixed tree.
  double total() {
    sum_lanes_tree(lanes_);
    return lanes_[0];
  }

 private:
  alignas(64) double lanes_[kSumLanes] = {};
};

// Sum of squares of y[0..n) (n <= kSumBlock), y[0] the block's first element.
template <class V>
double block_sum_squares(const float* y, int64_t n) {
  LaneSums sums;
  int64_t k = 0;
  for (; k + V::W <= n; k += V::W) sums.add<V>(k, V::load(y + k));
  for (; k < n; ++k) sums.add<VecScalar>(k, y[k]);
  return sums.total();
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
