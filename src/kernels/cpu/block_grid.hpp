// Work split of the CPU kernels that sum squares: every tensor cut into
// blocks of kSumBlock elements (math/sum_squares.hpp), the blocks of all
// tensors run in parallel, block sums are added per tensor in block order.
// The split does not depend on the thread count, so neither do the sums.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {

// One block: elements [begin, end) of tensor `tensor`, block `block` of all.
struct GridBlock {
  size_t tensor;
  int64_t begin, end;
  int64_t block;
};

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
    run_groups<1>(
        threads, sums, [](size_t) { return true; },
        [&](const GridBlock* b, int64_t, double* s) {
          const double v = fn(b->tensor, b->begin, b->end, b->block);
          if (s) *s = v;
        });
  }

  // The same over runs of up to Group consecutive blocks in the tensors'
  // order, a run going on from tensor t - 1 into tensor t only where
  // joins(t) (many small tensors make one run): fn(blocks, count,
  // block_sums) covers blocks[0..count) and, when block_sums is not null,
  // writes block k's sum to block_sums[k].
  template <int64_t Group, class Joins, class Fn>
  void run_groups(int threads, double* sums, Joins joins, Fn fn) const {
    std::vector<int64_t> starts;  // the runs' first blocks, then blocks()
    int64_t open = 0;             // the first block of the run being filled
    for (size_t t = 0; t + 1 < first_.size(); ++t) {
      if (t > 0 && first_[t] > open && !joins(t)) {
        starts.push_back(open);
        open = first_[t];
      }
      for (; first_[t + 1] - open > Group; open += Group) starts.push_back(open);
    }
    if (blocks() > open) starts.push_back(open);
    const int64_t runs = int64_t(starts.size());
    starts.push_back(blocks());
    std::vector<double> block_sums(sums ? size_t(blocks()) : 0);
    // A few blocks (one small gradient handed over) run on the calling
    // thread: waking helpers would cost more than the work.
    parallel_for(blocks() >= kParallelBlocks ? threads : 1, runs, [&](int64_t r) {
      const int64_t b0 = starts[size_t(r)], count = starts[size_t(r) + 1] - b0;
      std::array<GridBlock, Group> list;
      size_t t = size_t(std::upper_bound(first_.begin(), first_.end(), b0) - first_.begin()) - 1;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t b = b0 + i;
        while (b >= first_[t + 1]) ++t;
        const int64_t begin = (b - first_[t]) * kSumBlock;
        list[size_t(i)] = GridBlock{t, begin, std::min(lengths_[t], begin + kSumBlock), b};
      }
      fn(list.data(), count, sums ? block_sums.data() + b0 : nullptr);
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
