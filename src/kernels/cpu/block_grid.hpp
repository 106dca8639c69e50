// Work split of the CPU kernels that sum squares: every tensor cut into
// blocks of kSumBlock elements (math/sum_squares.hpp), the blocks of all
// tensors run in parallel, block sums are added per tensor in block order.
// The split does not depend on the thread count, so neither do the sums.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "math/sum_squares.hpp"

namespace dsopt {

class BlockGrid {
 public:
  static constexpr int64_t kParallelBlocks = 8;

  explicit BlockGrid(const std::vector<int64_t>& lengths) : lengths_(lengths), first_(lengths.size() + 1, 0) {
    for (size_t t = 0; t < lengths.size(); ++t) first_[t + 1] = first_[t] + sum_blocks(lengths[t]);
  }
  int64_t blocks() const { return first_.back(); }

  // Calls fn(tensor, begin, end, block) for every block, on `threads`
  // threads; fn returns the block's sum of squares (ignored unless `sums`).
  // With `sums`, sums[t] receives tensor t's total.
  template <class Fn>
  void run(int threads, double* sums, Fn fn) const {
    const int64_t n = blocks();
    std::vector<double> block_sums(sums ? size_t(n) : 0);
    // A few blocks (one small gradient handed over) run on the calling
    // thread: starting a team would cost more than the work.
#pragma omp parallel num_threads(threads) if (n >= kParallelBlocks)
    {
      size_t t = 0;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < n; ++b) {
        while (b >= first_[t + 1]) ++t;
        while (b < first_[t]) --t;
        const int64_t begin = (b - first_[t]) * kSumBlock;
        const int64_t end = std::min(lengths_[t], begin + kSumBlock);
        const double s = fn(t, begin, end, b);
        if (sums) block_sums[size_t(b)] = s;
      }
    }
    if (!sums) return;
    for (size_t t = 0; t + 1 < first_.size(); ++t) {
      double s = 0.0;
      for (int64_t b = first_[t]; b < first_[t + 1]; ++b) s += block_sums[size_t(b)];
      sums[t] = s;
    }
  }

 private:
  std::vector<int64_t> lengths_;
  std::vector<int64_t> first_;
};

}  // namespace dsopt
