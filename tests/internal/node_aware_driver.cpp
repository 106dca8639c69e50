// Runs dsopt's NodeAwareAllreduce under MPI on a declared topology and
// records what a reference needs (tests/python/test_node_aware_allreduce.py
// checks it against tests/python/node_aware_reference.py):
//
//   node_aware_driver OUTDIR RANKS_PER_NODE CALLS SEED SIZES [fp32|1bit]
//
// SIZES is comma-separated element counts. The world (MPI_COMM_WORLD, P
// ranks) is declared as N = P / R nodes of R ranks (node = rank / R) and
// split into node and rail communicators; every call feeds new random
// inputs (splitmix64 of seed, rank, call, tensor, index) to the node-aware
// allreduce and, on copies, to the flat CompressedAllreduce over the world.
//
// For every rank r and tensor t it writes OUTDIR/r<r>_t<t>_<kind>.npy,
// float32 arrays of shape (CALLS, len): in, out (node-aware result), ew, es
// (its worker and server errors after the call), flat_out, flat_ew,
// flat_es (the flat form's); with 1bit (the 1-bit node step) also en, its
// node worker errors (padded_length(n, R) values). OUTDIR/r<r>_bytes.txt has one line per call:
// the growth of bytes_sent of the node communicator, the rail communicator
// and the world communicator (the flat form's); OUTDIR/r<r>_formulas.txt
// NodeAwareAllreduce's node_bytes, rail_bytes and flat_cross_node_bytes for
// the sizes. OUTDIR/r<r>_topology.txt
// has one "key values..." line per check of Topology and Comm::split.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "comm/comm.hpp"
#include "comm/compressed_allreduce.hpp"
#include "comm/node_aware_allreduce.hpp"
#include "comm/topology.hpp"
#include "dsopt.h"
#include "kernels/kernels.hpp"

namespace {

int my_rank = 0;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "node_aware_driver rank %d: %s\n", my_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in (-1, 1) times a per-tensor magnitude plus a per-rank offset,
// with a few exact zeros of both signs.
float random_value(uint64_t seed, int rank, int call, size_t t, int64_t i) {
  const uint64_t h = mix(mix(mix(mix(seed) ^ uint64_t(rank)) ^ uint64_t(call) << 20 ^ uint64_t(t)) ^ uint64_t(i));
  if (h % 97 == 0) return (h >> 7) & 1 ? -0.0f : 0.0f;
  const double u = double(h >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
  return float(u * std::ldexp(1.0, int(t % 5) - 2) + 0.01 * rank);
}

void write_npy(const std::string& path, const std::vector<float>& data, int64_t rows, int64_t cols) {
  if (int64_t(data.size()) != rows * cols) die("write_npy: " + path + " has the wrong length");
  std::ostringstream dict;
  dict << "{'descr': '<f4', 'fortran_order': False, 'shape': (" << rows << ", " << cols << "), }";
  std::string header = dict.str();
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) die("cannot write " + path);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = uint16_t(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size() * 4));
  if (!f) die("short write to " + path);
}

// Appends the errors of `car`, tensor by tensor, to ew[t] and es[t].
void record_errors(const dsopt::CompressedAllreduce& car, const std::vector<int64_t>& sizes,
                   dsopt::Kernels& k, std::vector<std::vector<float>>& ew,
                   std::vector<std::vector<float>>& es) {
  const int P = car.world();
  std::vector<float> w(size_t(car.worker_error_numel())), s(size_t(car.server_error_numel()));
  k.copy_to_host(w.data(), car.worker_error(), w.size() * 4);
  k.copy_to_host(s.data(), car.server_error(), s.size() * 4);
  int64_t off = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t np = dsopt::CompressedAllreduce::padded_length(sizes[t], P);
    ew[t].insert(ew[t].end(), w.begin() + off, w.begin() + off + np);
    es[t].insert(es[t].end(), s.begin() + off / P, s.begin() + (off + np) / P);
    off += np;
  }
  if (off != car.worker_error_numel()) die("error buffers are not the padded lengths back to back");
}

int dummy_collective(const void*, void*, size_t, int32_t, int32_t, int32_t, void*) { return 0; }
int dummy_gather(const void*, void*, size_t, int32_t, int32_t, void*) { return 0; }

// Topology and Comm::split checks, one line each.
void check_topology(dsopt::Comm& world, const std::string& path) {
  const int P = world.size(), r = world.rank();
  std::ofstream f(path);
  const auto line = [&](const char* key, const dsopt::Topology& t) {
    f << key << ' ' << t.nodes << ' ' << t.ranks_per_node << ' ' << t.node << ' ' << t.local << ' '
      << (t.flat_reason.empty() ? "-" : "flat") << '\n';
  };
  // One machine: the shared-memory split finds one node of P ranks.
  line("discover", dsopt::Topology::discover(world));
  // Node ids of unequal groups (P - 1 ranks and 1): the flat topology.
  line("unequal", dsopt::Topology::from_node_ids(world, r == P - 1 ? 1 : 0));
  // Nodes of interleaved ranks (even and odd), numbered by their lowest
  // rank; split and summed over each node and each rail.
  if (P % 2 == 0) {
    const dsopt::Topology t = dsopt::Topology::from_node_ids(world, r % 2 == 0 ? 7 : 3);
    line("interleaved", t);
    dsopt::NodeComms c = dsopt::split_by_topology(world, t);
    int64_t node_sum = r, rail_sum = r;
    c.node->allreduce(&node_sum, &node_sum, 1, dsopt::Elem::I64, dsopt::ReduceOp::Sum, dsopt::Mem::host());
    c.rail->allreduce(&rail_sum, &rail_sum, 1, dsopt::Elem::I64, dsopt::ReduceOp::Sum, dsopt::Mem::host());
    f << "interleaved_sums " << node_sum << ' ' << rail_sum << ' ' << c.node->backend() << '\n';
  }
  // Declared sizes that do not divide P.
  try {
    dsopt::Topology::declared(r, P, P + 1);
    f << "declared_bad 0\n";
  } catch (const dsopt::Error& e) {
    f << "declared_bad " << e.status() << '\n';
  }
  // A world of one splits into a world of one.
  auto local = dsopt::make_local_comm();
  const dsopt::Topology lt = dsopt::Topology::declared(0, 1, 1);
  dsopt::NodeComms lc = dsopt::split_by_topology(*local, lt);
  f << "local_split " << lc.node->size() << ' ' << lc.rail->size() << ' ' << lc.node->backend() << '\n';
  // Custom callbacks cannot be split.
  dsopt_comm_ops ops{};
  ops.struct_size = sizeof ops;
  ops.rank = 0;
  ops.size = 1;
  ops.allreduce = dummy_collective;
  ops.reduce_scatter = dummy_collective;
  ops.allgather = dummy_gather;
  ops.alltoall = dummy_gather;
  auto custom = dsopt::make_custom_comm(ops, nullptr);
  try {
    custom->split(0, 0);
    f << "custom_split 0\n";
  } catch (const dsopt::Error& e) {
    f << "custom_split " << e.status() << '\n';
  }
  f << "status_codes " << DSOPT_EINVAL << ' ' << DSOPT_EUNSUPPORTED << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  if (argc != 6 && argc != 7) die("usage: node_aware_driver OUTDIR RANKS_PER_NODE CALLS SEED SIZES [fp32|1bit]");
  const std::string node_reduce = argc == 7 ? argv[6] : "fp32";
  if (node_reduce != "fp32" && node_reduce != "1bit") die("node reduce is fp32 or 1bit");
  const bool onebit = node_reduce == "1bit";
  const std::string out = argv[1];
  const int R = std::atoi(argv[2]), calls = std::atoi(argv[3]);
  const uint64_t seed = std::strtoull(argv[4], nullptr, 10);
  std::vector<int64_t> sizes;
  {
    std::istringstream s(argv[5]);
    std::string item;
    while (std::getline(s, item, ',')) sizes.push_back(std::stoll(item));
  }
  try {
    auto kernels = dsopt::make_cpu_kernels(1);
    const dsopt::Mem mem{kernels.get(), false};
    auto world = dsopt::make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
    world->prepare();
    const int P = world->size(), r = world->rank();
    const std::string prefix = out + "/r" + std::to_string(r);
    check_topology(*world, prefix + "_topology.txt");

    const dsopt::Topology topo = dsopt::Topology::declared(r, P, R);
    dsopt::NodeComms comms = dsopt::split_by_topology(*world, topo);
    dsopt::NodeAwareAllreduce na(*comms.node, *comms.rail, *kernels, mem, sizes, onebit);
    const bool onebit_node = na.onebit_node();
    dsopt::CompressedAllreduce flat(*world, *kernels, mem, sizes);
    if (na.nodes() != topo.nodes || na.ranks_per_node() != R) die("node-aware allreduce of another topology");

    const size_t T = sizes.size();
    std::vector<std::vector<float>> in(T), res(T), ew(T), es(T), en(T), flat_res(T), flat_ew(T), flat_es(T);
    std::vector<std::vector<float>> x(T), y(T);
    std::vector<float*> xp(T), yp(T);
    std::ofstream bytes(prefix + "_bytes.txt");
    std::ofstream(prefix + "_formulas.txt")
        << dsopt::NodeAwareAllreduce::node_bytes(sizes, topo.nodes, R, onebit) << ' '
        << dsopt::NodeAwareAllreduce::rail_bytes(sizes, topo.nodes, R, onebit) << ' '
        << dsopt::NodeAwareAllreduce::flat_cross_node_bytes(sizes, topo.nodes, R) << '\n';
    for (int k = 0; k < calls; ++k) {
      for (size_t t = 0; t < T; ++t) {
        x[t].resize(size_t(sizes[t]));
        for (int64_t i = 0; i < sizes[t]; ++i) x[t][size_t(i)] = random_value(seed, r, k, t, i);
        y[t] = x[t];
        xp[t] = x[t].data();
        yp[t] = y[t].data();
        in[t].insert(in[t].end(), x[t].begin(), x[t].end());
      }
      const uint64_t node0 = comms.node->bytes_sent(), rail0 = comms.rail->bytes_sent();
      na.run(xp.data());
      kernels->synchronize();
      const uint64_t world0 = world->bytes_sent();
      flat.run(yp.data());
      kernels->synchronize();
      bytes << comms.node->bytes_sent() - node0 << ' ' << comms.rail->bytes_sent() - rail0 << ' '
            << world->bytes_sent() - world0 << '\n';
      for (size_t t = 0; t < T; ++t) {
        res[t].insert(res[t].end(), x[t].begin(), x[t].end());
        flat_res[t].insert(flat_res[t].end(), y[t].begin(), y[t].end());
      }
      std::vector<int64_t> rail_sizes;
      for (int64_t n : sizes) rail_sizes.push_back(dsopt::NodeAwareAllreduce::slice_length(n, R, onebit_node));
      record_errors(na.rail_allreduce(), rail_sizes, *kernels, ew, es);
      if (onebit_node) {
        std::vector<float> e(size_t(na.node_error_numel()));
        kernels->copy_to_host(e.data(), na.node_error(), e.size() * 4);
        int64_t off = 0;
        for (size_t t = 0; t < T; ++t) {
          const int64_t np = dsopt::CompressedAllreduce::padded_length(sizes[t], R);
          en[t].insert(en[t].end(), e.begin() + off, e.begin() + off + np);
          off += np;
        }
        if (off != na.node_error_numel()) die("node errors are not the padded lengths back to back");
      }
      record_errors(flat, sizes, *kernels, flat_ew, flat_es);
    }
    for (size_t t = 0; t < T; ++t) {
      const std::string base = prefix + "_t" + std::to_string(t);
      const int64_t n = sizes[t], N = topo.nodes;
      const int64_t npp = dsopt::CompressedAllreduce::padded_length(
          dsopt::NodeAwareAllreduce::slice_length(n, R, onebit_node), int(N));
      const int64_t np = dsopt::CompressedAllreduce::padded_length(n, P);
      write_npy(base + "_in.npy", in[t], calls, n);
      write_npy(base + "_out.npy", res[t], calls, n);
      write_npy(base + "_ew.npy", ew[t], calls, npp);
      write_npy(base + "_es.npy", es[t], calls, npp / N);
      if (onebit_node)
        write_npy(base + "_en.npy", en[t], calls, dsopt::CompressedAllreduce::padded_length(n, R));
      write_npy(base + "_flat_out.npy", flat_res[t], calls, n);
      write_npy(base + "_flat_ew.npy", flat_ew[t], calls, np);
      write_npy(base + "_flat_es.npy", flat_es[t], calls, np / P);
    }
  } catch (const dsopt::Error& e) {
    die(std::string("dsopt error: ") + e.what());
  } catch (const std::exception& e) {
    die(std::string("exception: ") + e.what());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank == 0) std::printf("node_aware_driver: done\n");
  MPI_Finalize();
  return 0;
}
