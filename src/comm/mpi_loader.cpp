// The MPI communicator on demand: libdsopt is not linked to MPI; the first
// dsopt_comm_create_mpi (or dsopt_build_info) loads libdsopt_mpi, the
// plugin that is (comm/mpi_plugin.hpp). Where it looks, in order:
//   1. $DSOPT_MPI_PLUGIN, when set (only there);
//   2. next to the file that holds this code (libdsopt.so, or a program
//      linked to dsopt's objects);
//   3. the dynamic loader's search path (RUNPATH, LD_LIBRARY_PATH, ...).
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "comm/mpi_plugin.hpp"

namespace dsopt {
namespace {

struct Plugin {
  dsopt_mpi_plugin_create_fn create = nullptr;
  dsopt_mpi_plugin_library_version_fn library_version = nullptr;
  std::string error;  // why it is not there; empty when loaded
};

std::string this_files_directory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&this_files_directory), &info) == 0 || !info.dli_fname)
    return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

// dlopen of `path`, or nullptr with `tried` extended by why not.
void* open(const std::string& path, std::string& tried) {
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    tried += "\n  " + path + ": " + (why ? why : "cannot be loaded");
  }
  return lib;
}

void load(Plugin& out) {
  std::string tried;
  void* lib = nullptr;
  if (const char* chosen = std::getenv("DSOPT_MPI_PLUGIN"); chosen && *chosen) {
    lib = open(chosen, tried);
  } else {
    const std::string here = this_files_directory();
    if (!here.empty()) lib = open(here + kMpiPluginFile, tried);
    if (!lib) lib = open(kMpiPluginFile, tried);
  }
  if (!lib) {
    out.error = std::string("MPI is not available to this libdsopt: ") + kMpiPluginFile +
                ", dsopt's MPI communicator, could not be loaded (it needs an MPI library: "
                "on Debian/Ubuntu apt-get install openmpi-bin libopenmpi3, or put your MPI's "
                "libmpi on LD_LIBRARY_PATH; DSOPT_MPI_PLUGIN names the plugin's file). Tried:" +
                tried;
    return;
  }
  // Kept open for the life of the process: communicators outlive any one
  // dsopt object.
  const auto abi = reinterpret_cast<dsopt_mpi_plugin_abi_fn>(dlsym(lib, "dsopt_mpi_plugin_abi"));
  out.create = reinterpret_cast<dsopt_mpi_plugin_create_fn>(dlsym(lib, "dsopt_mpi_plugin_create"));
  out.library_version = reinterpret_cast<dsopt_mpi_plugin_library_version_fn>(
      dlsym(lib, "dsopt_mpi_plugin_library_version"));
  if (!abi || !out.create || !out.library_version || std::string(abi()) != kMpiPluginAbi) {
    out.create = nullptr;
    out.error = std::string("the MPI plugin that was loaded is not this libdsopt's (") +
                (abi ? abi() : "not a dsopt MPI plugin") + "; this is " + kMpiPluginAbi +
                "): install libdsopt and " + kMpiPluginFile + " from the same build";
  }
}

const Plugin& plugin() {
  static Plugin p;
  static std::once_flag once;
  std::call_once(once, [] { load(p); });
  return p;
}

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(int64_t fortran_handle) {
  const Plugin& p = plugin();
  if (!p.create) fail(DSOPT_EUNSUPPORTED, p.error);
  int status = DSOPT_OK;
  char message[1024] = "";
  Comm* comm = p.create(fortran_handle, &status, message, sizeof message);
  if (!comm) fail(status, message);
  return std::unique_ptr<Comm>(comm);
}

std::string mpi_build_info() {
  const Plugin& p = plugin();
  if (!p.create) return "mpi=unavailable";
  char version[256] = "";
  p.library_version(version, sizeof version);
  return std::string("mpi=") + version;
}

}  // namespace dsopt
