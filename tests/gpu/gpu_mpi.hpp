// Shared piece of the multi-rank GPU tests (mpirun -np 2): the skip rule.
#pragma once
#include <mpi.h>

#include <cstdio>
#include <cstdlib>

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

}  // namespace gpu_test
