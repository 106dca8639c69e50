// Work split of the elementwise CPU kernels (updates, the non-finite check):
// the elements of all tensors, back to back, cut into one even range per
// thread, whatever the sizes of the tensors. Only for work whose result
// does not depend on where ranges end (no sums: those use BlockGrid's
// fixed blocks).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"

namespace dsopt {

class ElementSplit {
 public:
  // Fewer elements than this run on the calling thread: starting a team
  // would cost more than the work.
  static constexpr int64_t kParallelElems = 1 << 14;

  // numel(i) is tensor i's element count, i < count.
  template <class Numel>
  ElementSplit(int64_t count, Numel numel) : first_(size_t(count) + 1, 0) {
    for (int64_t i = 0; i < count; ++i) first_[size_t(i) + 1] = first_[size_t(i)] + numel(i);
  }
  int64_t total() const { return first_.back(); }

  // Calls fn(tensor, begin, end, piece) for every part of every tensor
  // within `threads` even pieces (piece < threads) of all elements, on the
  // kernels' pool (thread_pool.hpp).
  template <class Fn>
  void run(int threads, Fn fn) const {
    const int64_t total = this->total();
    const int64_t n = total >= kParallelElems ? std::max(1, threads) : 1;
    // Boundaries on whole cache lines of fp32 values.
    const auto bound = [&](int64_t j) { return j == n ? total : total / n * j / 16 * 16; };
    parallel_for(int(n), n, [&](int64_t r) {
      pieces(bound(r), bound(r + 1), [&](size_t t, int64_t b, int64_t e) { fn(t, b, e, int(r)); });
    });
  }

 private:
  template <class Fn>
  void pieces(int64_t begin, int64_t end, Fn fn) const {
    size_t t = size_t(std::upper_bound(first_.begin(), first_.end(), begin) - first_.begin()) - 1;
    for (; begin < end; ++t) {
      const int64_t stop = std::min(end, first_[t + 1]);
      if (stop > begin) fn(t, begin - first_[t], stop - first_[t]);
      begin = stop;
    }
  }

  std::vector<int64_t> first_;  // first_[i]: where tensor i starts; first_.back(): the total
};

}  // namespace dsopt
