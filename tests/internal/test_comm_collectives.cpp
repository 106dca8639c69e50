// Every Comm collective on the local, the MPI and a custom communicator
// (its callbacks over MPI here), with values
// that depend on sender, receiver and position, against the expected
// result computed here; the byte counter against the ring formulas; and
// MPI's staging of device buffers (a stand-in "device" whose memory is host
// memory but which counts the staging copies), bypassed with cuda_aware.
// Float sums on host buffers are checked to follow dsopt's fixed order
// with values whose sum depends on it.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "dsopt.h"
#include "kernels/kernels.hpp"
#include "fake_device_kernels.hpp"

using namespace dsopt;

namespace {

int passes = 0, failures = 0, my_rank = 0;

void check(bool ok, const std::string& what) {
  if (ok) ++passes;
  else if (++failures <= 20) std::printf("rank %d: FAIL %s\n", my_rank, what.c_str());
}

float value(int sender, int receiver, size_t i) { return float(sender * 1000 + receiver * 100) + float(i % 97) * 0.25f; }

// Values whose float sum depends on the order of the additions.
double odd(int s, int b, size_t i) {
  return (1.0 + 1e-3 * double((s * 7919 + b * 104729 + int64_t(i) * 1299709) % 100003)) *
         (i % 3 ? 1e-4 : 3e3);
}

// x[b+1] + x[b+2] + ... + x[b] (ranks mod P), element i of block b.
template <class T>
T ring_order_sum(int P, int b, size_t i, const std::function<T(int)>& x) {
  T want = x((b + 1) % P);
  for (int k = 2; k <= P; ++k) want += x((b + k) % P);
  return want;
}

// allreduce of float sums on host buffers: the fixed order over the buffer
// padded to a multiple of P (1003 elements: padding at every P > 1).
template <class T>
void check_fixed_order_allreduce(Comm& comm, const Mem& mem, Elem e, const std::string& at,
                                 uint64_t& expected_bytes) {
  const int P = comm.size(), r = comm.rank();
  const size_t n = 1003, block = (n + size_t(P) - 1) / size_t(P);
  std::vector<T> send(n), recv(n, T(-1));
  for (size_t i = 0; i < n; ++i) send[i] = T(odd(r, 0, i));
  comm.allreduce(send.data(), recv.data(), n, e, ReduceOp::Sum, mem);
  bool ok = true;
  for (size_t i = 0; i < n; ++i)
    ok &= recv[i] == ring_order_sum<T>(P, int(i / block), i, [&](int s) { return T(odd(s, 0, i)); });
  check(ok, std::string("allreduce sum in the fixed order, ") + (sizeof(T) == 4 ? "f32" : "f64") + at);
  expected_bytes += 2 * uint64_t(P - 1) * n * sizeof(T) / uint64_t(P);
}

void run_all(Comm& comm, const Mem& mem, const std::string& label, bool variable_alltoall = true) {
  const int P = comm.size(), r = comm.rank();
  const size_t n = 1003;
  const std::string at = " [" + label + ", P=" + std::to_string(P) + "]";
  uint64_t expected_bytes = comm.bytes_sent();

  {  // allreduce sum, out of place and in place; max on int64
    std::vector<float> send(n), recv(n, -1.0f);
    for (size_t i = 0; i < n; ++i) send[i] = value(r, 0, i);
    comm.allreduce(send.data(), recv.data(), n, Elem::F32, ReduceOp::Sum, mem);
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int s = 0; s < P; ++s) want += value(s, 0, i);
      ok &= recv[i] == want;
    }
    check(ok, "allreduce sum f32 out of place" + at);
    comm.allreduce(send.data(), send.data(), n, Elem::F32, ReduceOp::Sum, mem);
    check(std::memcmp(send.data(), recv.data(), n * 4) == 0, "allreduce sum f32 in place" + at);
    expected_bytes += 2 * (2 * uint64_t(P - 1) * n * 4 / uint64_t(P));
    int64_t v[2] = {int64_t(r) * 7 - 3, -int64_t(r)};
    comm.allreduce(v, v, 2, Elem::I64, ReduceOp::Max, mem);
    check(v[0] == int64_t(P - 1) * 7 - 3 && v[1] == 0, "allreduce max i64" + at);
    expected_bytes += 2 * uint64_t(P - 1) * 16 / uint64_t(P);
  }
  if (mem.kernels->device() != Device::Cuda) {
    check_fixed_order_allreduce<float>(comm, mem, Elem::F32, at, expected_bytes);
    check_fixed_order_allreduce<double>(comm, mem, Elem::F64, at, expected_bytes);
    // a small reduce_scatter too (MPI: the ring below its large-block size)
    std::vector<float> send(n * P), recv(n, -1.0f);
    for (int b = 0; b < P; ++b)
      for (size_t i = 0; i < n; ++i) send[b * n + i] = float(odd(r, b, i));
    comm.reduce_scatter(send.data(), recv.data(), n, Elem::F32, ReduceOp::Sum, mem);
    bool ok = true;
    for (size_t i = 0; i < n; ++i)
      ok &= recv[i] == ring_order_sum<float>(P, r, i, [&](int s) { return float(odd(s, r, i)); });
    check(ok, "small reduce_scatter in the fixed order" + at);
    expected_bytes += uint64_t(P - 1) * n * 4;
  }
  {  // reduce_scatter: block b of rank s's send is value(s, b, i)
    std::vector<float> send(n * P), recv(n, -1.0f);
    for (int b = 0; b < P; ++b)
      for (size_t i = 0; i < n; ++i) send[b * n + i] = value(r, b, i);
    comm.reduce_scatter(send.data(), recv.data(), n, Elem::F32, ReduceOp::Sum, mem);
    bool ok = true;
    for (size_t i = 0; i < n; ++i) {
      float want = 0.0f;
      for (int s = 0; s < P; ++s) want += value(s, r, i);
      ok &= recv[i] == want;
    }
    check(ok, "reduce_scatter" + at);
    expected_bytes += uint64_t(P - 1) * n * 4;
  }
  {  // a large reduce_scatter runs as dsopt's ring: block b is summed as
     // x[b+1] + x[b+2] + ... + x[b] (ranks mod P), with values whose sum
     // depends on the order
    const size_t big = 20011;  // 80 KB blocks
    std::vector<float> send(big * P), recv(big, -1.0f);
    for (int b = 0; b < P; ++b)
      for (size_t i = 0; i < big; ++i) send[b * big + i] = float(odd(r, b, i));
    comm.reduce_scatter(send.data(), recv.data(), big, Elem::F32, ReduceOp::Sum, mem);
    // (a custom communicator's device buffers: the callback's own order)
    const bool runtime_order =
        std::string(comm.backend()) == "custom" && mem.kernels->device() == Device::Cuda;
    bool ok = true;
    for (size_t i = 0; i < big; ++i) {
      const float want = ring_order_sum<float>(P, r, i, [&](int s) { return float(odd(s, r, i)); });
      ok &= runtime_order ? std::fabs(recv[i] - want) <= 1e-6f * std::fabs(want) : recv[i] == want;
    }
    check(ok, "reduce_scatter ring order" + at);
    expected_bytes += uint64_t(P - 1) * big * 4;
    std::vector<int64_t> isend(big * P), irecv(big, 0);
    for (size_t k = 0; k < big * size_t(P); ++k) isend[k] = int64_t((k * 31 + size_t(r) * 17) % 1009) - 500;
    comm.reduce_scatter(isend.data(), irecv.data(), big, Elem::I64, ReduceOp::Max, mem);
    ok = true;
    for (size_t i = 0; i < big; ++i) {
      int64_t want = INT64_MIN;
      for (int s = 0; s < P; ++s)
        want = std::max(want, int64_t(((size_t(r) * big + i) * 31 + size_t(s) * 17) % 1009) - 500);
      ok &= irecv[i] == want;
    }
    check(ok, "reduce_scatter ring max i64" + at);
    expected_bytes += uint64_t(P - 1) * big * 8;
  }
  {  // allgather of doubles
    std::vector<double> send(n), recv(n * P, -1.0);
    for (size_t i = 0; i < n; ++i) send[i] = value(r, 0, i) * 0.5;
    comm.allgather(send.data(), recv.data(), n, Elem::F64, mem);
    bool ok = true;
    for (int s = 0; s < P; ++s)
      for (size_t i = 0; i < n; ++i) ok &= recv[s * n + i] == value(s, 0, i) * 0.5;
    check(ok, "allgather f64" + at);
    expected_bytes += uint64_t(P - 1) * n * 8;
  }
  {  // alltoall of bytes: block j of my send goes to rank j
    std::vector<uint8_t> send(n * P), recv(n * P, 0);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < n; ++i) send[j * n + i] = uint8_t(r * 31 + j * 7 + i);
    comm.alltoall(send.data(), recv.data(), n, Elem::U8, mem);
    bool ok = true;
    for (int s = 0; s < P; ++s)
      for (size_t i = 0; i < n; ++i) ok &= recv[s * n + i] == uint8_t(s * 31 + r * 7 + i);
    check(ok, "alltoall u8" + at);
    expected_bytes += uint64_t(P - 1) * n;
  }
  if (variable_alltoall) {  // alltoallv: rank s sends (s + j + 1) * 3 ints to rank j, blocks packed with a gap of 5
    std::vector<size_t> sc(P), so(P), rc(P), ro(P);
    size_t soff = 0, roff = 0;
    for (int j = 0; j < P; ++j) {
      sc[j] = size_t(r + j + 1) * 3;
      so[j] = soff;
      soff += sc[j] + 5;
      rc[j] = size_t(j + r + 1) * 3;
      ro[j] = roff;
      roff += rc[j] + 5;
    }
    std::vector<int32_t> send(soff, -7), recv(roff, -9);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < sc[j]; ++i) send[so[j] + i] = int32_t(r * 10000 + j * 100 + int(i));
    comm.alltoallv(send.data(), sc.data(), so.data(), recv.data(), rc.data(), ro.data(), Elem::I32, mem);
    bool ok = true;
    for (int s = 0; s < P; ++s)
      for (size_t i = 0; i < rc[s]; ++i) ok &= recv[ro[s] + i] == int32_t(s * 10000 + r * 100 + int(i));
    check(ok, "alltoallv i32" + at);
    for (int j = 0; j < P; ++j)
      if (j != r) expected_bytes += sc[j] * 4;
  }
  {  // start_alltoall and start_allgather, both in flight, then polled to the end
    std::vector<uint8_t> send(n * P), recv(n * P, 0);
    for (int j = 0; j < P; ++j)
      for (size_t i = 0; i < n; ++i) send[j * n + i] = uint8_t(r * 13 + j * 5 + i);
    std::vector<float> gsend(n), grecv(n * P, -1.0f);
    for (size_t i = 0; i < n; ++i) gsend[i] = value(r, 3, i);
    std::unique_ptr<CommRequest> a = comm.start_alltoall(send.data(), recv.data(), n, Elem::U8, mem);
    std::unique_ptr<CommRequest> g = comm.start_allgather(gsend.data(), grecv.data(), n, Elem::F32, mem);
    while (!a->test()) {
    }
    g->wait();
    check(g->test(), "a waited request tests complete" + at);
    bool ok = true;
    for (int s = 0; s < P; ++s)
      for (size_t i = 0; i < n; ++i) ok &= recv[s * n + i] == uint8_t(s * 13 + r * 5 + i);
    check(ok, "start_alltoall u8" + at);
    ok = true;
    for (int s = 0; s < P; ++s)
      for (size_t i = 0; i < n; ++i) ok &= grecv[s * n + i] == value(s, 3, i);
    check(ok, "start_allgather f32" + at);
    expected_bytes += uint64_t(P - 1) * n + uint64_t(P - 1) * n * 4;
  }
  check(comm.bytes_sent() == expected_bytes,
        "bytes_sent " + std::to_string(comm.bytes_sent()) + " == ring formulas " + std::to_string(expected_bytes) + at);
}

// dsopt_comm_ops over MPI_COMM_WORLD (host buffers only).
MPI_Datatype mpi_type(int32_t elem) {
  switch (elem) {
    case DSOPT_COMM_FLOAT32: return MPI_FLOAT;
    case DSOPT_COMM_FLOAT64: return MPI_DOUBLE;
    case DSOPT_COMM_INT32: return MPI_INT32_T;
    case DSOPT_COMM_INT64: return MPI_INT64_T;
    default: return MPI_UINT8_T;
  }
}
int custom_allreduce(const void* s, void* r, size_t n, int32_t e, int32_t op, int32_t, void*) {
  return MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, int(n), mpi_type(e),
                       op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD);
}
int custom_reduce_scatter(const void* s, void* r, size_t n, int32_t e, int32_t op, int32_t, void*) {
  return MPI_Reduce_scatter_block(s, r, int(n), mpi_type(e), op == DSOPT_COMM_MAX ? MPI_MAX : MPI_SUM,
                                  MPI_COMM_WORLD);
}
int custom_allgather(const void* s, void* r, size_t n, int32_t e, int32_t, void*) {
  return MPI_Allgather(s, int(n), mpi_type(e), r, int(n), mpi_type(e), MPI_COMM_WORLD);
}
int custom_alltoall(const void* s, void* r, size_t n, int32_t e, int32_t, void*) {
  return MPI_Alltoall(s, int(n), mpi_type(e), r, int(n), mpi_type(e), MPI_COMM_WORLD);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  auto cpu = make_cpu_kernels(1);

  auto local = make_local_comm();
  if (my_rank == 0) run_all(*local, Mem{cpu.get(), false}, "local");

  {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    dsopt_comm_ops ops{};
    ops.struct_size = sizeof ops;
    ops.rank = my_rank;
    ops.size = size;
    ops.allreduce = custom_allreduce;
    ops.reduce_scatter = custom_reduce_scatter;
    ops.allgather = custom_allgather;
    ops.alltoall = custom_alltoall;
    auto custom = make_custom_comm(ops, nullptr);
    run_all(*custom, Mem{cpu.get(), false}, "custom over MPI", false);
    FakeDeviceKernels device;
    run_all(*custom, Mem{&device, false}, "custom, device buffers", false);
  }

  auto mpi = make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
  run_all(*mpi, Mem{cpu.get(), false}, "mpi host");

  FakeDeviceKernels device;
  run_all(*mpi, Mem{&device, false}, "mpi staged device");
  check(device.staging_allocs > 0 && device.to_host > 0 && device.from_host > 0,
        "device buffers were staged through host memory");
  const int to_host = device.to_host, from_host = device.from_host;
  run_all(*mpi, Mem{&device, true}, "mpi cuda-aware");
  check(device.to_host == to_host && device.from_host == from_host,
        "cuda_aware passes device buffers to MPI without staging");

  // After prepare() (what every collective dsopt call does first) MPI runs
  // on a duplicate whose errors return: a message longer than its receive
  // buffer (rank 0 expects 2 elements from rank 1, which sends 4) is
  // DSOPT_ECOMM with MPI's message on rank 0, not an abort; MPI_COMM_WORLD
  // keeps its handler.
  mpi->prepare();
  run_all(*mpi, Mem{cpu.get(), false}, "mpi host, duplicated");
  // The failing alltoallv's buffers live until after MPI_Finalize: when
  // MPI_Alltoallv returns the error, Open MPI may still have the receives
  // from the other ranks posted (its wait returns at the first failed
  // request), and MPI writes them later, during any MPI call. Freed at the
  // end of the block, the late write was a heap-use-after-free (ASan in
  // `make test-sanitize`, comm_collectives_np4).
  std::vector<float> send, recv;
  if (mpi->size() > 1) {
    const int P = mpi->size();
    send.assign(size_t(4 * P), 1.0f);
    recv.assign(size_t(4 * P), 0.0f);
    std::vector<size_t> counts(size_t(P), 4);
    std::vector<size_t> offsets(static_cast<size_t>(P), 0);
    for (int j = 0; j < P; ++j) offsets[size_t(j)] = size_t(4 * j);
    std::vector<size_t> recv_counts = counts;
    if (my_rank == 0) recv_counts[1] = 2;
    int status = DSOPT_OK;
    std::string message;
    try {
      mpi->alltoallv(send.data(), counts.data(), offsets.data(), recv.data(), recv_counts.data(),
                     offsets.data(), Elem::F32, Mem{cpu.get(), false});
    } catch (const Error& e) {
      status = e.status();
      message = e.what();
    }
    if (my_rank == 0) {
      check(status == DSOPT_ECOMM && message.find("MPI_") != std::string::npos &&
                message.find("failed: ") != std::string::npos,
            "a failing MPI call is DSOPT_ECOMM with MPI's message (got " + std::to_string(status) +
                ": " + message + ")");
      // The failed communicator is not used again (MPI may still have
      // operations of the failed call posted): the next call fails at once.
      int again = DSOPT_OK;
      std::string why;
      try {
        int64_t one = 1;
        mpi->allreduce(&one, &one, 1, Elem::I64, ReduceOp::Sum, Mem{cpu.get(), false});
      } catch (const Error& e) {
        again = e.status();
        why = e.what();
      }
      check(again == DSOPT_ECOMM && why.find("earlier MPI call") != std::string::npos,
            "after a failed call the communicator refuses further calls (" + why + ")");
    }
    else
      check(status == DSOPT_OK || status == DSOPT_ECOMM, "the other ranks return (" + message + ")");
  }
  MPI_Errhandler world_handler;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler);
  check(world_handler == MPI_ERRORS_ARE_FATAL, "MPI_COMM_WORLD's error handler is untouched");
  MPI_Errhandler_free(&world_handler);

  std::printf("rank %d: %d passed, %d failed\n", my_rank, passes, failures);
  int any = failures ? 1 : 0, all = 0;
  MPI_Allreduce(&any, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // The comm goes before MPI_Finalize, as dsopt_comm_destroy must: after
  // it, the duplicate prepare() made can no longer be freed (LeakSanitizer
  // in `make test-sanitize` reports it).
  mpi.reset();
  MPI_Finalize();
  return all;
}
