// NCCL loaded at run time: libdsopt has no link-time dependency on
// libnccl.so.2, so it loads on machines without NCCL. The first call of
// nccl_api() opens the library (thread-safe, once per process).
#pragma once
#include <nccl.h>

namespace dsopt {

// ncclCommSplit (NCCL >= 2.18) with its config as an opaque pointer, so
// that this compiles against older nccl.h; dsopt passes nullptr (the new
// communicator inherits the parent's configuration).
using NcclCommSplitFn = ncclResult_t (*)(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                         void* config);

struct NcclApi {
  decltype(&::ncclAllReduce) all_reduce;
  decltype(&::ncclReduceScatter) reduce_scatter;
  decltype(&::ncclAllGather) all_gather;
  decltype(&::ncclSend) send;
  decltype(&::ncclRecv) recv;
  decltype(&::ncclGroupStart) group_start;
  decltype(&::ncclGroupEnd) group_end;
  decltype(&::ncclCommCount) comm_count;
  decltype(&::ncclCommUserRank) comm_user_rank;
  decltype(&::ncclCommCuDevice) comm_cu_device;
  decltype(&::ncclGetErrorString) get_error_string;
  decltype(&::ncclGetVersion) get_version;
  decltype(&::ncclGetLastError) get_last_error;  // nullptr in NCCL < 2.13
  decltype(&::ncclCommGetAsyncError) comm_get_async_error;
  decltype(&::ncclCommAbort) comm_abort;
  decltype(&::ncclCommDestroy) comm_destroy;
  NcclCommSplitFn comm_split;  // nullptr in NCCL < 2.18
  int version;  // NCCL_VERSION_CODE of the loaded library, e.g. 22809
};

// The loaded API. Throws Error(DSOPT_EUNSUPPORTED) when libnccl.so.2 cannot
// be loaded or lacks a needed function (every call, with the same text).
const NcclApi& nccl_api();

}  // namespace dsopt
