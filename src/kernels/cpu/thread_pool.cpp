#include "kernels/cpu/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace dsopt {
namespace {

// Set on a thread while it runs items of a call (a nested call runs inline).
thread_local bool t_in_pool = false;

class Pool {
 public:
  void run(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::defer_lock);
    if (threads <= 1 || n <= 1 || t_in_pool || !busy.try_lock()) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    const int helpers = int(std::min<int64_t>(threads, n)) - 1;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (; started_ < helpers; ++started_) {
        std::thread t([this] { work(); });
        t.detach();  // blocked on cv_ until the process ends
      }
      fn_ = &fn;
      n_ = n;
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
    t_in_pool = true;
    for (;;) {
      const int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
      if (b >= n_) break;
      for (int64_t e = std::min(n_, b + grain_), i = b; i < e; ++i) (*fn_)(i);
    }
    t_in_pool = false;
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
  int started_ = 0;  // helper threads
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  uint64_t generation_ = 0;
  int wanted_ = 0, inside_ = 0;
  bool open_ = false;
};

// Never destroyed: its threads may outlive static destructors. A fork's
// child has none of the parent's threads, and its copies of the locks and
// condition variables may be held or waited on by threads that do not
// exist there: it starts a pool of its own.
Pool* g_pool = nullptr;
std::once_flag g_pool_once;

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool;
    pthread_atfork(nullptr, nullptr, [] { g_pool = new Pool; });
  });
  return *g_pool;
}

}  // namespace

void parallel_for(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
  pool().run(threads, n, fn);
}

}  // namespace dsopt
