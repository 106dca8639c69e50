// Shared pieces of the multi-rank GPU tests (mpirun): the skip rule, the
// check that replicas agree, and the verdict agreed on every rank.
#pragma once
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "gpu_test.hpp"

extern "C" {
#include "support/mpi_world.h"
}

namespace gpu_test {

// Exits with kSkipped on every rank when some rank has no usable CUDA device.
inline void skip_unless_every_rank_has_a_device() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (!all_ranks(err == cudaSuccess && count > 0)) {
    if (world_rank() == 0)
      std::printf("SKIPPED: no CUDA device on some rank (%s)\n",
                  err != cudaSuccess ? cudaGetErrorString(err) : "cudaGetDeviceCount returned 0");
    std::fflush(stdout);
    MPI_Finalize();
    std::exit(kSkipped);
  }
}

// MPI started, every rank skipping together without a device, GPU 0
// current, and the world's dsopt communicator (the build printed on rank 0).
// nullptr, with MPI finalized and the failure recorded, where the world is
// not `ranks` ranks: the test then returns check_finish().
inline dsopt_comm* start_on_gpu0(int* argc, char*** argv, int ranks) {
  MPI_Init(argc, argv);
  const int rank = world_rank();
  std::snprintf(check_prefix, sizeof check_prefix, "rank %d: ", rank);
  skip_unless_every_rank_has_a_device();
  cuda_or_die(cudaSetDevice(0), "cudaSetDevice");
  if (!CHECK_EQ_INT(world_size(), ranks)) {
    MPI_Finalize();
    return nullptr;
  }
  dsopt_comm* comm = world_comm();
  if (!CHECK(comm != nullptr)) MPI_Abort(MPI_COMM_WORLD, 1);
  if (rank == 0) std::printf("%s\n", dsopt_build_info());
  return comm;
}

// An after-step check (run_onebit_pair's `after_step`): the CPU
// optimizer's parameters are the same on every rank after every step that
// applied an update agreed by all (0/1 Adam's local steps leave replicas
// apart until the next sync).
inline std::function<void(TensorSet&, int, int)> replicas_agree(const std::string& label) {
  auto last_applied = std::make_shared<int>(DSOPT_PHASE_FULL);
  return [label, last_applied](TensorSet& cpu_params, int step, int phase) {
    if (phase != DSOPT_PHASE_SKIPPED) *last_applied = phase;
    if (*last_applied == DSOPT_PHASE_LOCAL) return;
    for (size_t i = 0; i < cpu_params.size(); ++i)
      CHECKF(same_on_every_rank(cpu_params.host[i].data(), cpu_params.host[i].size()),
             "%s after step %d: tensor %zu is the same on every rank", label.c_str(), step, i);
  };
}

// This rank's checks summed up, MPI finalized: the exit code, 0 only where
// every rank passed.
inline int finish_on_every_rank() {
  const int rc = check_finish();
  const int all_ok = all_ranks(rc == 0);
  MPI_Finalize();
  return all_ok ? 0 : 1;
}

}  // namespace gpu_test
