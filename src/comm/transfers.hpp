// Collectives in flight (Comm::start_*), in the order they were started.
// MPI moves their bytes only inside MPI calls: poll() between pieces of
// work keeps them going.
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.hpp"

namespace dsopt {

class Transfers {
 public:
  // Returns the request's index; nullptr: a transfer already complete.
  size_t add(std::unique_ptr<CommRequest> r) {
    done_.push_back(r == nullptr);
    requests_.push_back(std::move(r));
    return requests_.size() - 1;
  }
  // Tests the oldest incomplete request (which drives them all).
  void poll() {
    while (oldest_ < done_.size() && ready(oldest_)) ++oldest_;
  }
  bool ready(size_t i) {
    if (!done_[i]) done_[i] = requests_[i]->test();
    return done_[i];
  }
  void wait(size_t i) {
    if (!done_[i]) requests_[i]->wait();
    done_[i] = true;
  }

 private:
  std::vector<std::unique_ptr<CommRequest>> requests_;
  std::vector<bool> done_;
  size_t oldest_ = 0;
};

}  // namespace dsopt
