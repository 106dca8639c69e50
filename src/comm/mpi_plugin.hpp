// The boundary between libdsopt and libdsopt_mpi, the plugin that holds
// the MPI communicator (comm/mpi_comm.cpp) and is the only part of dsopt
// linked to an MPI library. libdsopt loads it on the first
// dsopt_comm_create_mpi (comm/mpi_loader.cpp), so that it loads and runs
// where no MPI is installed.
//
// The entry points are C functions; the communicator they create is a
// dsopt::Comm of the same build, which is why the plugin checks that it
// comes from the same dsopt as the library (kMpiPluginAbi).
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/comm.hpp"

#define DSOPT_MPI_PLUGIN_EXPORT __attribute__((visibility("default")))

namespace dsopt {

// The file libdsopt looks for, next to itself and then by this name.
constexpr const char* kMpiPluginFile = "libdsopt_mpi.so." DSOPT_VERSION_STRING;
// What both sides compare before anything else.
// The plugin's communicators are dsopt::Comm objects that libdsopt calls
// through their virtual functions (split() and node_id() included, which
// make and free MPI communicators inside the plugin), so the number follows
// the layout of Comm as well as the entry points below.
constexpr const char* kMpiPluginAbi = "dsopt " DSOPT_VERSION_STRING " mpi plugin 2";

}  // namespace dsopt

extern "C" {
// kMpiPluginAbi of the plugin.
typedef const char* (*dsopt_mpi_plugin_abi_fn)(void);
// A Comm over the MPI communicator whose Fortran handle is given, or
// nullptr with *status (a DSOPT_E* code) and the message set.
typedef dsopt::Comm* (*dsopt_mpi_plugin_create_fn)(int64_t fortran_handle, int* status,
                                                     char* message, size_t capacity);
// MPI_Get_library_version's first line (MPI need not be initialised).
typedef void (*dsopt_mpi_plugin_library_version_fn)(char* out, size_t capacity);
}
