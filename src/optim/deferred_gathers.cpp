#include "optim/deferred_gathers.hpp"

#include "base/error.hpp"

namespace dsopt {

int64_t DeferredGathers::gathers_pending() {
  int64_t n = 0;
  for (uint64_t t : gather_tickets_)
    if (!runner_.done(t)) ++n;
  return n;
}

bool DeferredGathers::defer_gathers(int64_t chunks, CommBytes bytes,
                                    const std::function<void(int64_t)>& run) {
  if (!enabled_ || chunks == 0 || comm_.size() == 1 || !comm_.concurrent_calls()) return false;
  runner_threaded_before_ = runner_.threaded();
  runner_.set_threaded(true);
  bytes_at_defer_ = comm_.bytes();
  deferred_bytes_ = bytes;
  gather_tickets_.clear();
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t c = order_.chunk_at(k);
    gather_tickets_.push_back(runner_.post([run, c] { run(c); }));
  }
  comm_.set_pending(this, [this] { wait_gathers_quietly(); });
  return true;
}

void DeferredGathers::wait_gathers(int64_t bucket, const char* call) {
  if (bucket < 0) comm_.finish_others(this);  // another optimizer's gathers on this communicator
  if (gather_tickets_.empty()) return;
  const int64_t last = int64_t(gather_tickets_.size()) - 1;
  if (bucket < 0 || bucket > last) bucket = last;
  runner_.wait_for(gather_tickets_[size_t(bucket)]);
  if (bucket < last && !runner_.failed()) {
    if (kernels_.device() == Device::Cuda) kernels_.synchronize();
    return;
  }
  gather_tickets_.clear();
  comm_.clear_pending(this);
  try {
    runner_.wait();
    runner_.set_threaded(runner_threaded_before_);  // at-once steps reduce as before
    if (kernels_.device() == Device::Cuda) kernels_.synchronize();
  } catch (const Error& e) {
    mark_failed_(e.status(), std::string("the parameter allgather of the step failed: ") + e.what());
    fail(e.status(), std::string(call) + ": the deferred parameter allgather failed: " + e.what() +
                         "; the optimizer is marked failed (docs/robustness.md)");
  } catch (const std::exception& e) {
    mark_failed_(DSOPT_EINTERNAL, e.what());
    fail(DSOPT_EINTERNAL, std::string(call) + ": the deferred parameter allgather failed: " + e.what());
  }
}

void DeferredGathers::wait_gathers_quietly() {
  // Nothing of this optimizer's in flight: leave the communicator alone
  // (at destruction it may already be gone when nothing was deferred).
  if (gather_tickets_.empty()) return;
  try {
    wait_gathers(-1, "dsopt_destroy");
  } catch (...) {
  }
}

}  // namespace dsopt
