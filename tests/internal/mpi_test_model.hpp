// The internal tests under mpirun (test_zero_offload.cpp,
// test_zero_node_aware.cpp, test_onebit_node_aware_device.cpp): their
// checks and verdict, and a small model of mixed parameter types, its
// gradients, and an Optimizer made on it with the CPU kernels or a
// stand-in device. Every rank makes the same parameters from a seed.
#pragma once
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "api/config.hpp"
#include "comm/comm.hpp"
#include "facade/optimizer.hpp"
#include "fake_device_kernels.hpp"

namespace dsopt {
namespace mpi_test {

inline int passes = 0, failures = 0, my_rank = 0;

inline void check(bool ok, const std::string& what) {
  if (ok) ++passes;
  else if (++failures <= 20) std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
}

inline const int64_t kNumels[] = {1500, 77, 2049, 6, 900};
inline const int32_t kParamTypes[] = {DSOPT_FLOAT32, DSOPT_BFLOAT16, DSOPT_FLOAT32, DSOPT_FLOAT16, DSOPT_BFLOAT16};

struct Model {
  std::vector<std::vector<uint8_t>> params, grads;
  std::vector<dsopt_tensor> param_desc, grad_desc;
};

inline Model make_model(uint32_t seed) {
  Model m;
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto cpu = make_cpu_kernels(1);
  for (size_t t = 0; t < sizeof kNumels / sizeof *kNumels; ++t) {
    const int64_t n = kNumels[t];
    const DType d = DType(kParamTypes[t]);
    std::vector<float> values(static_cast<size_t>(n));
    for (float& v : values) v = normal(gen);
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(d));
    cpu->from_float(values.data(), bytes.data(), d, n);
    m.params.push_back(bytes);
    m.grads.emplace_back(size_t(n) * 4);
  }
  for (size_t t = 0; t < m.params.size(); ++t) {
    m.param_desc.push_back(dsopt_tensor{m.params[t].data(), kNumels[t], kParamTypes[t], 0});
    m.grad_desc.push_back(dsopt_tensor{m.grads[t].data(), kNumels[t], DSOPT_FLOAT32, 0});
  }
  return m;
}

// The step's gradients; `rank` < 0: the same on every rank.
inline void fill_grads(Model& m, int step, int rank) {
  std::mt19937 gen(uint32_t(1000 * step + (rank < 0 ? 999 : rank)));
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (size_t t = 0; t < m.grads.size(); ++t) {
    auto* g = reinterpret_cast<float*>(m.grads[t].data());
    for (int64_t i = 0; i < kNumels[t]; ++i) g[i] = normal(gen);
  }
}

inline std::unique_ptr<Optimizer> make(const OptimizerConfig& cfg, Comm& comm, Model& m, bool device) {
  std::unique_ptr<Kernels> kernels;
  if (device)
    kernels = std::make_unique<FakeDeviceKernels>();
  else
    kernels = make_cpu_kernels(1);
  auto opt = std::make_unique<Optimizer>(cfg, comm, std::move(kernels), m.param_desc.data(),
                                         int64_t(m.param_desc.size()));
  opt->created();
  opt->set_run_id(42);
  return opt;
}

// MPI started (MPI_THREAD_MULTIPLE asked for) and the world's Comm; `size`
// the world size.
inline std::unique_ptr<Comm> start_on_every_rank(int* argc, char*** argv, int* size) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  MPI_Comm_size(MPI_COMM_WORLD, size);
  return make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
}

// This rank's count printed, MPI finalized: the exit code, 0 only where
// every rank passed.
inline int finish_on_every_rank() {
  std::printf("rank %d: %d passed, %d failed\n", my_rank, passes, failures);
  int ok = failures == 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return all ? 0 : 1;
}

}  // namespace mpi_test
}  // namespace dsopt
