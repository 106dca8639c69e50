// The one exception type inside dsopt. Every layer throws it; the C API
// shims in src/api turn it into a status code and the per-thread message.
#pragma once
#include <stdexcept>
#include <string>

#include "dsopt.h"

namespace dsopt {

class Error : public std::runtime_error {
 public:
  Error(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

[[noreturn]] inline void fail(int status, const std::string& message) { throw Error(status, message); }

}  // namespace dsopt
