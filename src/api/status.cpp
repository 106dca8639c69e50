// Status strings and the per-thread last error.
#include <string>

#include "api/guard.hpp"

namespace dsopt {
namespace {
thread_local std::string t_last_error;
}
void set_last_error(const std::string& message) { t_last_error = message; }
void clear_last_error() { t_last_error.clear(); }
const char* last_error_cstr() { return t_last_error.c_str(); }
}  // namespace dsopt

extern "C" {

DSOPT_API const char* dsopt_status_string(int status) {
  switch (status) {
    case DSOPT_OK: return "success";
    case DSOPT_EINVAL: return "invalid argument or configuration";
    case DSOPT_EUNSUPPORTED: return "not supported by this build or combination";
    case DSOPT_ENOMEM: return "out of memory";
    case DSOPT_EBUFS: return "buffer too small";
    case DSOPT_ECORRUPT: return "state blob is corrupt";
    case DSOPT_EMISMATCH: return "mismatch between ranks, or state blob of another optimizer";
    case DSOPT_ECOMM: return "communication failure";
    case DSOPT_ECUDA: return "CUDA runtime failure";
    case DSOPT_EINTERNAL: return "internal error";
    case DSOPT_ENONFINITE: return "training is not progressing: gradients keep overflowing";
    default: return "unknown status";
  }
}

DSOPT_API const char* dsopt_last_error(void) { return dsopt::last_error_cstr(); }
}
