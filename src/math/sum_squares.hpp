// The one summation order for sums of squares (gradient norms, and the
// compressed allreduce's scales in docs/design/decisions.md C3), so CPU threads and CUDA
// blocks produce the same double, bit for bit, whatever the thread count.
//
// A tensor of n fp32 values is cut into blocks of kSumBlock elements (the
// last one shorter). Inside a block, lane j (0 <= j < kSumLanes) adds
// x[j]^2, x[j + kSumLanes]^2, ... in double, in that order; then the lanes
// are combined by the fixed tree lane[j] += lane[j + s] for s = kSumLanes/2,
// ..., 1. The tensor's sum is the block sums added in block order.
// (Squares of floats are exact in double; only the additions round.)
#pragma once
#include <cstdint>

#include "math/hd.hpp"

namespace dsopt {

constexpr int kSumLanes = 256;
constexpr int64_t kSumBlock = 16 * kSumLanes;  // 4096 elements

DSOPT_ISA_BEGIN

DSOPT_HD int64_t sum_blocks(int64_t n) { return (n + kSumBlock - 1) / kSumBlock; }

// Combines the lane partials in place; the result is lanes[0].
DSOPT_HD void sum_lanes_tree(double* lanes) {
  for (int s = kSumLanes / 2; s >= 1; s >>= 1)
    for (int j = 0; j < s; ++j) lanes[j] += lanes[j + s];
}

DSOPT_ISA_END
}  // namespace dsopt
