#include "kernels/cpu/cpu_car.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/block_grid.hpp"

namespace dsopt {
namespace cpu_car {
namespace {

// The compressed allreduce calls its primitives many times per call (per
// piece, between polls of the transfers), with MPI waits in between. On
// OpenMP threads every such call is a parallel region whose idle threads
// spin (libgomp: GOMP_SPINCOUNT, up to milliseconds) before they sleep;
// when ranks share cores, that spinning takes the cores a peer rank needs
// for its part of the same call, and the waits grow with every region
// (4 ranks of 2 threads on 2 cores: 10-100x slower than 1 thread).
// So these primitives run on a pool of their own whose idle threads block
// at once (a condition variable), and whose caller, done with its share,
// blocks too until the helpers that took work are done. Which thread runs
// which block does not change any result: blocks and their sums are fixed.
class Pool {
 public:
  // fn(b) for b in [0, n) on up to `threads` threads (the caller one of
  // them). Another call in progress (another optimizer's, on another
  // thread): this one runs on the caller alone.
  void run(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (threads <= 1 || n <= 1 || !busy.owns_lock()) {
      for (int64_t b = 0; b < n; ++b) fn(b);
      return;
    }
    const int helpers = int(std::min<int64_t>(threads, n)) - 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (owner_ != getpid()) {  // a fork's child has none of the parent's threads
        workers_.clear();
        owner_ = getpid();
      }
      while (int(workers_.size()) < helpers) {
        std::thread t([this] { work(); });
        t.detach();  // blocked on cv_ until the process ends
        workers_.push_back(1);
      }
      fn_ = &fn;
      n_ = n;
      // Claims of a few blocks each: dynamic, so a helper that starts late
      // (its core busy) takes less.
      grain_ = std::max<int64_t>(1, n / (int64_t(helpers + 1) * 8));
      next_.store(0, std::memory_order_relaxed);
      wanted_ = helpers;
      open_ = true;
      ++generation_;
    }
    cv_.notify_all();
    claim();
    std::unique_lock<std::mutex> lock(mutex_);
    open_ = false;  // helpers not started yet stay out
    done_cv_.wait(lock, [&] { return inside_ == 0; });
    fn_ = nullptr;
  }

 private:
  void claim() {
    for (;;) {
      const int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
      if (b >= n_) return;
      for (int64_t e = std::min(n_, b + grain_), i = b; i < e; ++i) (*fn_)(i);
    }
  }

  void work() {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return generation_ != seen && open_ && wanted_ > 0; });
      seen = generation_;
      --wanted_;
      ++inside_;
      lock.unlock();
      claim();
      lock.lock();
      if (--inside_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex busy_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::vector<char> workers_;
  pid_t owner_ = 0;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int wanted_ = 0, inside_ = 0;
  bool open_ = false;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: its threads may outlive static destructors
  return *p;
}

// A few blocks run on the caller: waking helpers would cost more.
constexpr int64_t kPoolBlocks = 8;

// BlockGrid::run on the pool.
template <class Fn>
void run_blocks(const BlockGrid& grid, int threads, double* sums, Fn fn) {
  const int64_t n = grid.blocks();
  std::vector<double> block_sums(sums ? size_t(n) : 0);
  const std::function<void(int64_t)> one = [&](int64_t b) {
    const double s = grid.block(b, fn);
    if (sums) block_sums[size_t(b)] = s;
  };
  pool().run(n >= kPoolBlocks ? threads : 1, n, one);
  if (sums) grid.totals(block_sums.data(), sums);
}

std::vector<int64_t> lengths(const CarTensor* t, int64_t count, int64_t (*len)(const CarTensor&, int),
                             int world) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(len(t[i], world));
  return v;
}
int64_t padded(const CarTensor& t, int) { return t.padded; }
int64_t chunk(const CarTensor& t, int world) { return t.padded / world; }
int64_t original(const CarTensor& t, int) { return t.n; }

}  // namespace

void worker_sumsq(const CpuIsa& isa, const CarTensor* t, int64_t count, int threads, double* sumsq) {
  run_blocks(BlockGrid(lengths(t, count, padded, 1)), threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    return isa.car_worker_sumsq_block(t[k], b, e);
  });
}

void worker_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales,
                 uint8_t* send, int64_t msg_bytes, int threads) {
  run_blocks(BlockGrid(lengths(t, count, padded, world)), threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_worker_pack_block(t[k], b, e, world, scales[k], send, msg_bytes);
    return 0.0;
  });
}

void server_sum(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* recv,
                int64_t msg_bytes, const float* weights, double* sumsq, int threads) {
  run_blocks(BlockGrid(lengths(t, count, chunk, world)), threads, sumsq, [&](size_t k, int64_t b, int64_t e, int64_t) {
    return isa.car_server_sum_block(t[k], b, e, world, recv, msg_bytes, weights, count, k);
  });
}

void server_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales,
                 uint8_t* out, int threads) {
  run_blocks(BlockGrid(lengths(t, count, chunk, world)), threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_server_pack_block(t[k], b, e, scales[k], out);
    return 0.0;
  });
}

void decode(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* gathered,
            int64_t msg_bytes, const float* scales, int threads) {
  run_blocks(BlockGrid(lengths(t, count, original, world)), threads, nullptr, [&](size_t k, int64_t b, int64_t e, int64_t) {
    isa.car_decode_block(t[k], b, e, world, gathered, msg_bytes, scales, count, k);
    return 0.0;
  });
}

}  // namespace cpu_car
}  // namespace dsopt
