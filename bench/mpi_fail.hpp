// What the MPI benchmarks do when something fails: print the rank and the
// reason, and end every rank (a benchmark that goes on would time nothing).
#pragma once
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "dsopt.h"

namespace bench {

[[noreturn]] inline void fail_all(const char* program, int rank, const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: rank %d: %s\n", program, rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// "<call> failed: <status>: <dsopt_last_error()>", or "" when status is OK.
inline std::string call_failure(int status, const char* call) {
  if (status == DSOPT_OK) return "";
  return std::string(call) + " failed: " + dsopt_status_string(status) + ": " + dsopt_last_error();
}

}  // namespace bench
