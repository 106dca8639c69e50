// Work split of the CPU kernels that sum squares: every tensor cut into
// blocks of kSumBlock elements (math/sum_squares.hpp), the blocks of all
// tensors run in parallel, block sums are added per tensor in block order.
// The split does not depend on the thread count, so neither do the sums.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
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
  // threads of the kernels' pool (thread_pool.hpp); fn returns the block's
  // sum of squares (ignored unless `sums`). With `sums`, sums[t] receives
  // tensor t's total.
  template <class Fn>
  void run(int threads, double* sums, Fn fn) const {
    run_groups(threads, 1, sums, [&](size_t t, int64_t begin, int64_t end, int64_t b, double* s) {
      const double v = fn(t, begin, end, b);
      if (s) *s = v;
    });
  }

  // The same over runs of up to `group` consecutive blocks of one tensor:
  // fn(tensor, begin, end, first block, block_sums) covers elements
  // [begin, end) and, when block_sums is not null, writes the runs' block
  // sums to block_sums[0..).
  template <class Fn>
  void run_groups(int threads, int64_t group, double* sums, Fn fn) const {
    std::vector<int64_t> items(first_.size(), 0);  // items[t]: tensor t's first run
    for (size_t t = 0; t + 1 < first_.size(); ++t)
      items[t + 1] = items[t] + (first_[t + 1] - first_[t] + group - 1) / group;
    std::vector<double> block_sums(sums ? size_t(blocks()) : 0);
    // A few blocks (one small gradient handed over) run on the calling
    // thread: waking helpers would cost more than the work.
    parallel_for(blocks() >= kParallelBlocks ? threads : 1, items.back(), [&](int64_t i) {
      const size_t t = size_t(std::upper_bound(items.begin(), items.end(), i) - items.begin()) - 1;
      const int64_t b = first_[t] + (i - items[t]) * group;  // the run's first block
      const int64_t begin = (b - first_[t]) * kSumBlock;
      const int64_t end = std::min(lengths_[t], begin + group * kSumBlock);
      fn(t, begin, end, b, sums ? block_sums.data() + b : nullptr);
    });
    if (sums) totals(block_sums.data(), sums);
  }

 private:
  // sums[t] = tensor t's block sums (block_sums[b], one per block) in block order.
  void totals(const double* block_sums, double* sums) const {
    for (size_t t = 0; t + 1 < first_.size(); ++t) {
      double s = 0.0;
      for (int64_t b = first_[t]; b < first_[t + 1]; ++b) s += block_sums[b];
      sums[t] = s;
    }
  }

  std::vector<int64_t> lengths_;
  std::vector<int64_t> first_;
};

}  // namespace dsopt
