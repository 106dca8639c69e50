// Runs collective calls in the order they are posted, either at once in the
// posting thread or on one thread of its own, so that gradient reductions
// overlap the caller's backward (dsopt_grad_ready). The first task that
// throws stops the queue: the tasks after it are dropped and wait()
// rethrows its error.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace dsopt {

class CommRunner {
 public:
  CommRunner() = default;
  ~CommRunner() { stop(); }
  // Drops the queued tasks and joins the thread after the running one.
  void stop();
  CommRunner(const CommRunner&) = delete;
  CommRunner& operator=(const CommRunner&) = delete;

  // Whether posted tasks run on the runner's thread (started on first use);
  // false runs each task inside post(). Only while nothing is queued.
  void set_threaded(bool threaded);
  bool threaded() const { return threaded_; }

  // Queues `task`; returns its ticket (1, 2, ...).
  uint64_t post(std::function<void()> task);
  // Whether the task with this ticket has finished (or was dropped).
  bool done(uint64_t ticket);
  // Waits until it has (its error, if any, comes from wait()).
  void wait_for(uint64_t ticket);
  // Waits until every posted task has finished; rethrows the first error
  // (once) after all of them are done or dropped.
  void wait();
  // The same, forgetting any error (cleanup after a failed call).
  void wait_quietly();
  // Whether a task has failed and its error has not been rethrown yet.
  bool failed();

 private:
  void loop();

  bool threaded_ = false;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t posted_ = 0, finished_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace dsopt
