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

  // fn's call for block b (any b < blocks(), on any thread): its sum.
  template <class Fn>
  double block(int64_t b, Fn& fn) const {
    const size_t t = size_t(std::upper_bound(first_.begin(), first_.end(), b) - first_.begin()) - 1;
    const int64_t begin = (b - first_[t]) * kSumBlock;
    return fn(t, begin, std::min(lengths_[t], begin + kSumBlock), b);
  }
  // sums[t] = tensor t's block sums (block_sums[b], one per block) in block order.
  void totals(const double* block_sums, double* sums) const {
    for (size_t t = 0; t + 1 < first_.size(); ++t) {
      double s = 0.0;
      for (int64_t b = first_[t]; b < first_[t + 1]; ++b) s += block_sums[b];
      sums[t] = s;
    }
  }

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
    if (sums) totals(block_sums.data(), sums);
  }

 private:
  std::vector<int64_t> lengths_;
  std::vector<int64_t> first_;
};

}  // namespace dsopt
