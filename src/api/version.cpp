// Versions and what this build contains.
#include <string>

#include "api/guard.hpp"
#include "comm/comm.hpp"
#include "kernels/kernels.hpp"

extern "C" {

DSOPT_API int dsopt_version_number(void) {
  return DSOPT_VERSION_MAJOR * 10000 + DSOPT_VERSION_MINOR * 100 + DSOPT_VERSION_PATCH;
}

DSOPT_API const char* dsopt_build_info(void) {
  static const std::string info = [] {
    std::string s = std::string("version=") + DSOPT_VERSION_STRING + " " + dsopt::cuda_build_info();
    s += DSOPT_HAVE_NCCL ? " nccl=dlopen" : " nccl=off";
    s += " " + dsopt::mpi_build_info();
    s += std::string(" simd=") + dsopt::cpu_isa_name();
    return s;
  }();
  return info.c_str();
}
}
