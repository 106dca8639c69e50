// The deferred parameter allgather of ZeRO (docs/guides/zero.md "Deferred
// allgather"): with "deferred_allgather", a step returns once the update
// is done and the gather of each bucket is posted to dsopt's thread, in
// gather order (optim/gather_order.hpp); later calls wait for the buckets
// they need, numbered by position in that order.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/comm_runner.hpp"
#include "kernels/kernels.hpp"
#include "optim/gather_order.hpp"

namespace dsopt {

class DeferredGathers {
 public:
  // `enabled`: the config's "deferred_allgather". `mark_failed(status,
  // what)` records a failed gather as the optimizer's failure. Every part
  // outlives this object.
  DeferredGathers(bool enabled, Comm& comm, CommRunner& runner, Kernels& kernels,
                  std::function<void(int, const std::string&)> mark_failed)
      : enabled_(enabled),
        comm_(comm),
        runner_(runner),
        kernels_(kernels),
        mark_failed_(std::move(mark_failed)) {}

  // The order the buckets are posted in (dsopt_gather_order).
  GatherOrder& order() { return order_; }
  const GatherOrder& order() const { return order_; }
  // From an update: posts run(c) for every chunk c, in order(), to dsopt's thread
  // when "deferred_allgather" is on and the communicator may be called
  // from it, and returns true; else returns false (the caller gathers at
  // once). `bytes`: what this rank sends for them.
  bool defer_gathers(int64_t chunks, CommBytes bytes, const std::function<void(int64_t)>& run);
  // Buckets of the last step not yet known to have arrived (0 when nothing
  // is in flight).
  int64_t gathers_pending();
  // Waits until buckets 0 .. `bucket` have arrived (-1 or past the last:
  // every bucket). A gather that failed marks the optimizer failed and
  // throws its status; `call` names the entry point.
  void wait_gathers(int64_t bucket, const char* call);
  // The same for every bucket, forgetting a failure (destroy).
  void wait_gathers_quietly();
  // What this rank sent from the communicator's count `before` on,
  // counting deferred gathers in flight as posted (their bytes are known
  // in advance; they count as they run on dsopt's thread).
  CommBytes bytes_since(CommBytes before) const {
    return gather_tickets_.empty() ? comm_.bytes() - before : bytes_at_defer_ - before + deferred_bytes_;
  }

 private:
  const bool enabled_;
  Comm& comm_;
  CommRunner& runner_;
  Kernels& kernels_;
  std::function<void(int, const std::string&)> mark_failed_;
  std::vector<uint64_t> gather_tickets_;  // the runner's ticket of each deferred bucket
  CommBytes deferred_bytes_;    // what the deferred gathers send
  CommBytes bytes_at_defer_;    // the communicator's count when they were posted
  bool runner_threaded_before_ = false;  // the runner's mode before they were posted
  GatherOrder order_;                     // the order the buckets are posted in
};

}  // namespace dsopt
