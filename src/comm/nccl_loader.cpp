#include "comm/nccl_loader.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "base/error.hpp"

namespace dsopt {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";

struct Loaded {
  NcclApi api{};
  std::string error;  // empty when loaded
};

template <class Fn>
bool bind(void* lib, const char* name, Fn& fn, std::string& error) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr && error.empty())
    error = std::string("cannot load ") + kLibrary + ": " + name + " not found; install NCCL >= 2.7 "
            "or put it on LD_LIBRARY_PATH";
  return fn != nullptr;
}

void load(Loaded& out) {
  // Kept open for the life of the process: communicators outlive any one
  // dsopt object.
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    out.error = std::string("cannot load ") + kLibrary + ": " + (why ? why : "unknown error") +
                "; install NCCL or put it on LD_LIBRARY_PATH";
    return;
  }
  NcclApi& a = out.api;
  std::string& e = out.error;
  bind(lib, "ncclAllReduce", a.all_reduce, e);
  bind(lib, "ncclReduceScatter", a.reduce_scatter, e);
  bind(lib, "ncclAllGather", a.all_gather, e);
  bind(lib, "ncclSend", a.send, e);
  bind(lib, "ncclRecv", a.recv, e);
  bind(lib, "ncclGroupStart", a.group_start, e);
  bind(lib, "ncclGroupEnd", a.group_end, e);
  bind(lib, "ncclCommCount", a.comm_count, e);
  bind(lib, "ncclCommUserRank", a.comm_user_rank, e);
  bind(lib, "ncclCommCuDevice", a.comm_cu_device, e);
  bind(lib, "ncclGetErrorString", a.get_error_string, e);
  bind(lib, "ncclGetVersion", a.get_version, e);
  bind(lib, "ncclCommGetAsyncError", a.comm_get_async_error, e);
  bind(lib, "ncclCommAbort", a.comm_abort, e);
  bind(lib, "ncclCommDestroy", a.comm_destroy, e);
  a.comm_split = reinterpret_cast<NcclCommSplitFn>(dlsym(lib, "ncclCommSplit"));
  a.get_last_error = reinterpret_cast<decltype(a.get_last_error)>(dlsym(lib, "ncclGetLastError"));
  if (!e.empty()) return;
  a.version = 0;
  if (a.get_version(&a.version) != ncclSuccess) a.version = 0;
}

}  // namespace

const NcclApi& nccl_api() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] { load(loaded); });
  if (!loaded.error.empty()) fail(DSOPT_EUNSUPPORTED, loaded.error);
  return loaded.api;
}

}  // namespace dsopt
