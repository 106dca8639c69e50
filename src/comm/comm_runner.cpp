#include "comm/comm_runner.hpp"

namespace dsopt {

void CommRunner::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  thread_ = std::thread();
  stop_ = false;
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = posted_;
  queue_.clear();
}

void CommRunner::set_threaded(bool threaded) { threaded_ = threaded; }

uint64_t CommRunner::post(std::function<void()> task) {
  if (!threaded_) {
    const uint64_t ticket = ++posted_;
    if (!error_) {
      try {
        task();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    finished_ = ticket;
    return ticket;
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    ticket = ++posted_;
  }
  cv_.notify_all();
  return ticket;
}

bool CommRunner::done(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ >= ticket;
}

void CommRunner::wait_for(uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this, ticket] { return finished_ >= ticket; });
}

void CommRunner::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return finished_ == posted_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

bool CommRunner::failed() {
  std::lock_guard<std::mutex> lock(mu_);
  return bool(error_);
}

void CommRunner::wait_quietly() {
  try {
    wait();
  } catch (...) {
  }
}

void CommRunner::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (stop_) return;  // queued tasks are dropped
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = bool(error_);
    lock.unlock();
    std::exception_ptr failed;
    if (!skip) {
      try {
        task();
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !error_) error_ = failed;
    ++finished_;
    cv_.notify_all();
  }
}

}  // namespace dsopt
