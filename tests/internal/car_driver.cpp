// Runs dsopt's CompressedAllreduce under MPI and records everything a
// reference needs (tests/python/test_compressed_allreduce.py checks it):
//
//   car_driver OUTDIR JOBFILE
//
// JOBFILE has one job per line (blank lines and '#' lines are skipped):
//
//   NAME MODE CALLS SOURCE SIZES
//
//   MODE    batched: one CompressedAllreduce over every tensor, one run() per call
//           single:  one CompressedAllreduce per tensor, run() for each in turn
//   CALLS   number of calls in a row (errors carry over between them)
//   SOURCE  seed:S   new random inputs every call, from S, the rank, call, tensor
//           fixed:S  the call-0 inputs of seed:S in every call
//           files    OUTDIR/NAME/in_r<rank>_t<t>.f32: CALLS*n raw float32 each
//   SIZES   comma-separated element counts
//
// For every rank r and tensor t it writes OUTDIR/NAME/r<r>_t<t>_<kind>.npy,
// float32 arrays of shape (CALLS, len) with kind in = the input of the call,
// out = what run() left in x, ew = worker error after the call (n'), es =
// server error after the call (n'/P). The MPI calls made inside run() are
// intercepted (PMPI): OUTDIR/NAME/r<r>_wire.bin holds the bytes each of them
// sent (alltoallv: every destination's block in rank order; allgather,
// allreduce, bcast: the send buffer; MPI_Ialltoall and MPI_Iallgather as
// alltoall and allgather) and r<r>_wire.txt one line per call:
//   <call> <function> <element size> <element count> <offset in wire.bin>
// and r<r>_bytes.txt the Comm's bytes_sent counter growth per call.
// $DSOPT_CAR_THREADS sets the kernels' CPU threads (default 1).
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "comm/compressed_allreduce.hpp"
#include "kernels/kernels.hpp"

namespace {

// ---- interception of the collectives (PMPI) --------------------------------

struct WireRecord {
  int call;
  std::string function;
  int elem_size;
  int64_t count;
  uint64_t offset;
};

bool g_capture = false;
int g_call = 0;
std::vector<uint8_t> g_wire;
std::vector<WireRecord> g_records;

int type_size(MPI_Datatype t) {
  int s = 0;
  PMPI_Type_size(t, &s);
  return s;
}

void record(const char* function, const void* data, int elem_size, int64_t count) {
  if (!g_capture) return;
  WireRecord r{g_call, function, elem_size, count, uint64_t(g_wire.size())};
  const auto* p = static_cast<const uint8_t*>(data);
  if (p && count > 0) g_wire.insert(g_wire.end(), p, p + size_t(count) * size_t(elem_size));
  g_records.push_back(r);
}

}  // namespace

extern "C" {

int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[], MPI_Datatype sendtype,
                  void* recvbuf, const int recvcounts[], const int rdispls[], MPI_Datatype recvtype,
                  MPI_Comm comm) {
  if (g_capture) {
    int size = 0;
    PMPI_Comm_size(comm, &size);
    const int es = type_size(sendtype);
    std::vector<uint8_t> all;
    int64_t total = 0;
    for (int j = 0; j < size; ++j) {
      const auto* p = static_cast<const uint8_t*>(sendbuf) + int64_t(sdispls[j]) * es;
      all.insert(all.end(), p, p + int64_t(sendcounts[j]) * es);
      total += sendcounts[j];
    }
    record("alltoallv", all.data(), es, total);
  }
  return PMPI_Alltoallv(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts, rdispls, recvtype, comm);
}

int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                 MPI_Datatype recvtype, MPI_Comm comm) {
  if (g_capture) {
    int size = 0;
    PMPI_Comm_size(comm, &size);
    record("alltoall", sendbuf, type_size(sendtype), int64_t(sendcount) * size);
  }
  return PMPI_Alltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm) {
  record("allgather", sendbuf, type_size(sendtype), sendcount);
  return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
}

// The nonblocking forms record under the blocking names: the same bytes.
int MPI_Ialltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                  MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  if (g_capture) {
    int size = 0;
    PMPI_Comm_size(comm, &size);
    record("alltoall", sendbuf, type_size(sendtype), int64_t(sendcount) * size);
  }
  return PMPI_Ialltoall(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}

int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf, int recvcount,
                   MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  record("allgather", sendbuf, type_size(sendtype), sendcount);
  return PMPI_Iallgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm, request);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  record("allreduce", sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf, type_size(datatype), count);
  return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  record("bcast", buffer, type_size(datatype), count);
  return PMPI_Bcast(buffer, count, datatype, root, comm);
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype datatype,
                             MPI_Op op, MPI_Comm comm) {
  record("reduce_scatter_block", nullptr, type_size(datatype), recvcount);
  return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
}

}  // extern "C"

namespace {

using dsopt::CompressedAllreduce;

int my_rank = 0;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "car_driver rank %d: %s\n", my_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

int64_t padded_length(int64_t n, int P) {
  int a = P, b = 8;
  while (b) {
    const int t = a % b;
    a = b;
    b = t;
  }
  const int64_t unit = int64_t(P) * (8 * P / a);
  return n % unit == 0 ? n : n + unit - n % unit;
}

// splitmix64 of (seed, rank, call, tensor, index): inputs anyone can regenerate.
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float random_value(uint64_t seed, int rank, int call, size_t t, int64_t i) {
  const uint64_t h = mix(mix(mix(mix(seed) ^ uint64_t(rank)) ^ uint64_t(call) << 20 ^ uint64_t(t)) ^ uint64_t(i));
  // A few exact zeros of both signs, otherwise uniform in (-1, 1) times a
  // per-tensor magnitude plus a small per-rank offset (the ranks disagree).
  if (h % 97 == 0) return (h >> 7) & 1 ? -0.0f : 0.0f;
  const double u = double(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
  return float(u * std::ldexp(1.0, int(t % 5) - 2) + 0.01 * rank);
}

void write_npy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (" << rows << ", " << cols << "), }";
  std::string header = dict.str();
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) die("cannot write " + path);
  const char magic[] = "\x93NUMPY\x01\x00";
  f.write(magic, 8);
  const uint16_t len = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 4));
  if (!f) die("short write to " + path);
}

struct Job {
  std::string name, mode, source;
  int calls = 1;
  std::vector<int64_t> sizes;
};

std::vector<Job> read_jobs(const std::string& path) {
  std::ifstream f(path);
  if (!f) die("cannot read job file " + path);
  std::vector<Job> jobs;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    Job j;
    std::string sizes;
    if (!(in >> j.name >> j.mode >> j.calls >> j.source >> sizes)) die("bad job line: " + line);
    if (j.mode != "batched" && j.mode != "single") die("bad mode in: " + line);
    std::istringstream s(sizes);
    std::string item;
    while (std::getline(s, item, ',')) j.sizes.push_back(std::stoll(item));
    jobs.push_back(j);
  }
  return jobs;
}

void run_job(const Job& job, const std::string& out_dir, dsopt::Comm& comm, dsopt::Kernels& kernels) {
  const int P = comm.size(), r = comm.rank();
  const size_t T = job.sizes.size();
  const std::string dir = out_dir + "/" + job.name;
  const dsopt::Mem mem{&kernels, false};
  std::filesystem::create_directories(dir);

  // Inputs: calls x n per tensor.
  std::vector<std::vector<float>> inputs(T);
  for (size_t t = 0; t < T; ++t) {
    const int64_t n = job.sizes[t];
    inputs[t].resize(size_t(job.calls * n));
    if (job.source == "files") {
      const std::string path = dir + "/in_r" + std::to_string(r) + "_t" + std::to_string(t) + ".f32";
      std::ifstream f(path, std::ios::binary);
      if (!f.read(reinterpret_cast<char*>(inputs[t].data()), std::streamsize(inputs[t].size() * 4)))
        die("cannot read " + path);
    } else {
      const bool fixed = job.source.rfind("fixed:", 0) == 0;
      if (!fixed && job.source.rfind("seed:", 0) != 0) die("bad source " + job.source);
      const uint64_t seed = std::stoull(job.source.substr(job.source.find(':') + 1));
      for (int k = 0; k < job.calls; ++k)
        for (int64_t i = 0; i < n; ++i) inputs[t][size_t(k * n + i)] = random_value(seed, r, fixed ? 0 : k, t, i);
    }
  }

  std::vector<std::unique_ptr<CompressedAllreduce>> cars;
  if (job.mode == "batched") {
    cars.emplace_back(new CompressedAllreduce(comm, kernels, mem, job.sizes));
  } else {
    for (size_t t = 0; t < T; ++t)
      cars.emplace_back(new CompressedAllreduce(comm, kernels, mem, std::vector<int64_t>{job.sizes[t]}));
  }

  std::vector<std::vector<float>> outs(T), ews(T), ess(T);
  std::vector<std::vector<float>> x(T);
  for (size_t t = 0; t < T; ++t) x[t].resize(size_t(job.sizes[t]));
  std::vector<uint64_t> bytes;
  g_wire.clear();
  g_records.clear();
  for (int k = 0; k < job.calls; ++k) {
    for (size_t t = 0; t < T; ++t) {
      const int64_t n = job.sizes[t];
      std::memcpy(x[t].data(), inputs[t].data() + k * n, size_t(n) * 4);
    }
    const uint64_t before = comm.bytes_sent();
    g_call = k;
    g_capture = true;
    if (job.mode == "batched") {
      std::vector<float*> ptrs;
      for (auto& v : x) ptrs.push_back(v.data());
      cars[0]->run(ptrs.data());
    } else {
      for (size_t t = 0; t < T; ++t) {
        float* p = x[t].data();
        cars[t]->run(&p);
      }
    }
    kernels.synchronize();
    g_capture = false;
    bytes.push_back(comm.bytes_sent() - before);
    // Every object's errors, back to back in tensor order (n' and n'/P each).
    std::vector<float> ew_all, es_all;
    for (const auto& car : cars) {
      std::vector<float> ew(size_t(car->worker_error_numel())), es(size_t(car->server_error_numel()));
      kernels.copy_to_host(ew.data(), car->worker_error(), ew.size() * 4);
      kernels.copy_to_host(es.data(), car->server_error(), es.size() * 4);
      ew_all.insert(ew_all.end(), ew.begin(), ew.end());
      es_all.insert(es_all.end(), es.begin(), es.end());
    }
    int64_t w = 0;
    for (size_t t = 0; t < T; ++t) {
      const int64_t n = job.sizes[t], np = padded_length(n, P), c = np / P;
      if (CompressedAllreduce::padded_length(n, P) != np) die("padded length differs from DeepSpeed's rule");
      if (w + np > int64_t(ew_all.size())) die("error buffers shorter than the padded lengths");
      outs[t].insert(outs[t].end(), x[t].begin(), x[t].end());
      ews[t].insert(ews[t].end(), ew_all.begin() + w, ew_all.begin() + w + np);
      ess[t].insert(ess[t].end(), es_all.begin() + w / P, es_all.begin() + w / P + c);
      w += np;
    }
  }

  const std::string prefix = dir + "/r" + std::to_string(r);
  for (size_t t = 0; t < T; ++t) {
    const int64_t n = job.sizes[t], np = padded_length(n, P);
    const std::string base = prefix + "_t" + std::to_string(t);
    write_npy(base + "_in.npy", inputs[t], job.calls, n);
    write_npy(base + "_out.npy", outs[t], job.calls, n);
    write_npy(base + "_ew.npy", ews[t], job.calls, np);
    write_npy(base + "_es.npy", ess[t], job.calls, np / P);
  }
  {
    std::ofstream f(prefix + "_wire.bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(g_wire.data()), std::streamsize(g_wire.size()));
    std::ofstream idx(prefix + "_wire.txt");
    for (const WireRecord& w : g_records)
      idx << w.call << ' ' << w.function << ' ' << w.elem_size << ' ' << w.count << ' ' << w.offset << '\n';
    std::ofstream b(prefix + "_bytes.txt");
    for (uint64_t v : bytes) b << v << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  if (argc != 3) die("usage: car_driver OUTDIR JOBFILE");
  const std::string out_dir = argv[1];
  int status = 0;
  try {
    // $DSOPT_CAR_THREADS: CPU threads of the kernels (the sums must not depend on it).
    const char* threads = std::getenv("DSOPT_CAR_THREADS");
    auto kernels = dsopt::make_cpu_kernels(threads ? std::atoi(threads) : 1);
    auto comm = dsopt::make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
    for (const Job& job : read_jobs(argv[2])) run_job(job, out_dir, *comm, *kernels);
  } catch (const dsopt::Error& e) {
    die(std::string("dsopt error: ") + e.what());
  } catch (const std::exception& e) {
    die(std::string("exception: ") + e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank == 0) std::printf("car_driver: done\n");
  MPI_Finalize();
  return status;
}
