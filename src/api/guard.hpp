// Every extern "C" entry point runs its body through guarded(): exceptions
// become status codes, the message goes to the calling thread's last error.
#pragma once
#include <new>
#include <string>

#include "base/error.hpp"

namespace dsopt {

void set_last_error(const std::string& message);
void clear_last_error();
const char* last_error_cstr();

template <class Body>
int guarded(Body&& body) noexcept {
  try {
    clear_last_error();
    body();
    return DSOPT_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("out of host memory");
    return DSOPT_ENOMEM;
  } catch (const std::exception& e) {
    set_last_error(std::string("internal error: ") + e.what());
    return DSOPT_EINTERNAL;
  } catch (...) {
    set_last_error("internal error: unknown exception");
    return DSOPT_EINTERNAL;
  }
}

// Throws Error(DSOPT_EINVAL, "<what> is NULL") for a null pointer.
inline void require_nonnull(const void* p, const char* what) {
  if (!p) fail(DSOPT_EINVAL, std::string(what) + " is NULL");
}

}  // namespace dsopt
