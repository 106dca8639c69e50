// The compressed allreduce in pieces (src/comm/car_pieces.hpp) against the
// same primitives run once over whole tensors in the unpipelined order
// (worker sums, pack, all-to-all, scales, server sum, server pack,
// all-gathers, decode): outputs, worker and server errors bit for bit, and
// the bytes counted, over several calls (errors carry over) on random data,
// for tensor sets smaller than one piece, odd sizes and many pieces, with
// pieces of 1 and 3 sum blocks and the automatic choice; the pieces run on
// kernels of 1, 2 and 3 threads (the reference on 1): the bits must not
// depend on the thread count.
//
//   mpirun -np P test_car_pieces
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.hpp"
#include "comm/compressed_allreduce.hpp"
#include "kernels/kernels.hpp"

namespace {

using dsopt::CarTensor;
using dsopt::CompressedAllreduce;

int g_rank = 0;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
}

float scale_of(double sumsq, int64_t len) {
  return float(std::sqrt(sumsq)) / float(std::sqrt(double(len)));
}

// The unpipelined order, on whole tensors (the reference).
class Reference {
 public:
  Reference(dsopt::Comm& comm, dsopt::Kernels& kernels, const std::vector<int64_t>& sizes)
      : comm_(comm), kernels_(kernels), P_(comm.size()) {
    int64_t offset = 0, worker = 0;
    for (int64_t n : sizes) {
      const int64_t padded = CompressedAllreduce::padded_length(n, P_);
      tensors_.push_back(CarTensor{nullptr, n, padded, nullptr, nullptr, offset});
      offset += padded / P_ / 8;
      worker += padded;
    }
    msg_ = offset;
    ew_.assign(size_t(worker), 0.0f);
    es_.assign(size_t(worker / P_), 0.0f);
    int64_t w = 0;
    for (CarTensor& t : tensors_) {
      t.worker_error = ew_.data() + w;
      t.server_error = es_.data() + w / P_;
      w += t.padded;
    }
  }

  void run(float* const* x) {
    const int64_t T = int64_t(tensors_.size());
    for (int64_t t = 0; t < T; ++t) tensors_[size_t(t)].x = x[t];
    const dsopt::Mem mem{&kernels_, false};
    std::vector<uint8_t> send(static_cast<size_t>(msg_ * P_)), recv(send.size()), server(static_cast<size_t>(msg_));
    const size_t count = static_cast<size_t>(T);
    std::vector<double> sumsq(count);
    std::vector<float> scales(count), all(count * size_t(P_));
    kernels_.car_worker_sumsq(tensors_.data(), T, sumsq.data());
    for (int64_t t = 0; t < T; ++t) scales[size_t(t)] = scale_of(sumsq[size_t(t)], tensors_[size_t(t)].padded);
    kernels_.car_worker_pack(tensors_.data(), T, P_, scales.data(), send.data(), msg_);
    comm_.alltoall(send.data(), recv.data(), size_t(msg_), dsopt::Elem::U8, mem);
    comm_.allgather(scales.data(), all.data(), size_t(T), dsopt::Elem::F32, mem);
    std::vector<float> weights(all.size());
    for (size_t i = 0; i < all.size(); ++i) weights[i] = all[i] * (1.0f / float(P_));
    kernels_.car_server_sum(tensors_.data(), T, P_, recv.data(), msg_, weights.data(), sumsq.data());
    for (int64_t t = 0; t < T; ++t)
      scales[size_t(t)] = scale_of(sumsq[size_t(t)], tensors_[size_t(t)].padded / P_);
    kernels_.car_server_pack(tensors_.data(), T, P_, scales.data(), server.data());
    comm_.allgather(server.data(), send.data(), size_t(msg_), dsopt::Elem::U8, mem);
    comm_.allgather(scales.data(), all.data(), size_t(T), dsopt::Elem::F32, mem);
    kernels_.car_decode(tensors_.data(), T, P_, send.data(), msg_, all.data());
  }

  const std::vector<float>& worker_error() const { return ew_; }
  const std::vector<float>& server_error() const { return es_; }

 private:
  dsopt::Comm& comm_;
  dsopt::Kernels& kernels_;
  int P_;
  std::vector<CarTensor> tensors_;
  int64_t msg_ = 0;
  std::vector<float> ew_, es_;
};

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Rank-dependent values with a shared part, a few zeros of both signs.
float value(int call, size_t t, int64_t i) {
  const uint64_t h = mix(mix(mix(uint64_t(g_rank) * 7919 + uint64_t(call)) ^ t) ^ uint64_t(i));
  if (h % 101 == 0) return (h >> 9) & 1 ? -0.0f : 0.0f;
  const double u = double(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
  return float(u * std::ldexp(1.0, int(t % 4) - 1) + 0.05 * std::sin(double(i)));
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

void compare(dsopt::Comm& comm, dsopt::Kernels& ref_kernels, dsopt::Kernels& kernels, int threads,
             const std::vector<int64_t>& sizes, int64_t piece_blocks) {
  const dsopt::Mem mem{&kernels, false};
  Reference ref(comm, ref_kernels, sizes);
  CompressedAllreduce car(comm, kernels, mem, sizes, piece_blocks);
  std::string name = "sizes";
  for (int64_t n : sizes) name += " " + std::to_string(n);
  name += ", pieces of " + std::to_string(piece_blocks) + " blocks (" + std::to_string(car.pieces()) + " pieces), " +
          std::to_string(threads) + " thread(s)";
  for (int call = 0; call < 3; ++call) {
    std::vector<std::vector<float>> a(sizes.size()), b(sizes.size());
    std::vector<float*> pa, pb;
    for (size_t t = 0; t < sizes.size(); ++t) {
      a[t].resize(size_t(sizes[t]));
      for (int64_t i = 0; i < sizes[t]; ++i) a[t][size_t(i)] = value(call, t, i);
      b[t] = a[t];
      pa.push_back(a[t].data());
      pb.push_back(b[t].data());
    }
    const uint64_t before_ref = comm.bytes_sent();
    ref.run(pa.data());
    const uint64_t ref_bytes = comm.bytes_sent() - before_ref;
    const uint64_t before = comm.bytes_sent();
    car.run(pb.data());
    const uint64_t bytes = comm.bytes_sent() - before;
    const std::string at = name + ", call " + std::to_string(call);
    for (size_t t = 0; t < sizes.size(); ++t)
      check(same_bits(a[t].data(), b[t].data(), a[t].size()), at + ": output of tensor " + std::to_string(t));
    check(size_t(car.worker_error_numel()) == ref.worker_error().size() &&
              same_bits(car.worker_error(), ref.worker_error().data(), ref.worker_error().size()),
          at + ": worker errors");
    check(size_t(car.server_error_numel()) == ref.server_error().size() &&
              same_bits(car.server_error(), ref.server_error().data(), ref.server_error().size()),
          at + ": server errors");
    check(bytes == ref_bytes, at + ": bytes sent " + std::to_string(bytes) + " vs " + std::to_string(ref_bytes));
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  {
    std::unique_ptr<dsopt::Comm> comm = dsopt::make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
    comm->prepare();
    std::unique_ptr<dsopt::Kernels> one = dsopt::make_cpu_kernels(1);
    const std::vector<std::vector<int64_t>> cases = {
        {1},
        {7, 13, 100},
        {4096 * 4 + 5},
        {123457},
        {1, 70001, 8, 4096 * 8, 333333},
        {(int64_t(1) << 20) + 3},
    };
    for (int threads : {1, 2, 3}) {
      std::unique_ptr<dsopt::Kernels> kernels = dsopt::make_cpu_kernels(threads);
      for (const auto& sizes : cases)
        for (int64_t blocks : {int64_t(1), int64_t(3), int64_t(0)})
          compare(*comm, *one, *kernels, threads, sizes, blocks);
    }
  }
  int failures = 0;
  MPI_Allreduce(&g_failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0) std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  MPI_Finalize();
  return failures ? 1 : 0;
}
