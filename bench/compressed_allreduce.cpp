// The 1-bit compressed allreduce (src/comm/compressed_allreduce.hpp) against
// the fp32 allreduce it replaces, on every rank of MPI_COMM_WORLD.
//
// For each size (1M, 16M and 64M floats by default; M = 2^20) every rank
// holds its own fp32 vector and the operations run in interleaved rounds,
// each from the same input:
//   fp32 allreduce   the sum of the vector in place through dsopt's MPI
//                    Comm, what a training step runs: dsopt's fixed-order
//                    sum (a ring reduce-scatter of MPI_Sendrecv, then
//                    MPI_Allgather; the 1/P scaling a training step adds
//                    is not timed)
//   MPI_Allreduce    MPI's own MPI_Allreduce(MPI_SUM) in place, for
//                    comparison (bytes: the fp32 formula)
//   1-bit CAR        CompressedAllreduce::run: the vector becomes its
//                    error-compensated 1-bit average (worker compress,
//                    all-to-all of signs, server average and recompress,
//                    all-gather of signs, decode)
//   1-bit node-aware NodeAwareAllreduce::run (with --hierarchy node_aware, or
//                    auto on several nodes of several ranks; beside the flat
//                    one): the fp32 reduce-scatter inside the node, the flat
//                    1-bit allreduce over the rail (the ranks of one local
//                    index, one per node) on the slices, the rail's result
//                    codes allgathered inside the node and decoded
//                    (src/comm/node_aware_allreduce.hpp)
// One call's time is the slowest rank's, from a barrier to its return; the
// table shows the median and the best over the timed rounds. Bytes sent per
// rank come from three places: the Comm's counter (ring-collective
// accounting), the formula of docs/design/compressed-allreduce.md section 7
// (fp32: 2(P-1)/P * 4n; CAR: (P-1)/P * n'/4 + 8(P-1); node-aware:
// NodeAwareAllreduce::node_bytes + rail_bytes), and the loopback
// device's transmit counter (/sys/class/net/lo, read by rank 0: everything
// every rank put on lo during the call, TCP/IP headers included, divided by
// P). The last one is only meaningful when the ranks talk TCP over lo
// (--mca btl tcp,self) and nothing else uses lo, as in bench/netem.sh.
// Bytes across nodes per rank: the Comm's count of those sent to ranks of
// other nodes (bytes().inter_node) beside its formula (fp32: 2(P-R)/P * 4n;
// CAR: NodeAwareAllreduce::flat_cross_node_bytes; node-aware: rail_bytes),
// and under bench/netem_two_nodes.sh the htb counters of the link between
// the emulated nodes (both directions, headers included, divided by P).
// The nodes: --ranks-per-node R declares nodes of R consecutive ranks; 0
// (default) takes those MPI's shared-memory split finds (one node under a
// plain mpirun on one machine; the emulated ones under
// bench/netem_two_nodes.sh), as the library's "topology" key does.
//
// With the loopback counter, the fp32 row also gives the link's throughput
// (all ranks' lo bytes / median time), and the CAR row is split into the
// time its bytes need at that throughput and the rest (the computation and
// latency the overlap of kernels and transfers leaves exposed).
//
// Before timing, the first call of a fresh CompressedAllreduce (zero errors)
// is checked on every rank against the simulation of docs/design/compressed-allreduce.md
// 3.6, computed here from the inputs of all ranks (which every rank can
// regenerate): rank r's output chunk r must carry the reference signs and
// scale; every output chunk must be +/- one scale; all ranks must end with
// the same bits. The node-aware one's first call: every chunk of every
// rail's slice +/- one scale (on one node, nothing compressed: the fp32
// mean), the same bits on all ranks. Error feedback is checked once per
// form (node-aware: on several nodes): 40 calls on the same input (1M - 3
// floats, so padded) must average out to the exact mean. The fp32 allreduce is checked
// against the exact sum on a sample of elements, and the Comm's byte counts,
// sent and across nodes, must equal the formulas.
//
//   compressed_allreduce_bench [--min-numel N] [--max-numel N] [--iters I]
//                              [--large-iters L] [--warmup W] [--threads T]
//                              [--fp32 0|1] [--piece-blocks B]
//                              [--hierarchy flat|node_aware|auto]
//                              [--ranks-per-node R] [--node-reduce fp32|1bit]
// Sizes outside [--min-numel, --max-numel] are left out; --iters timed
// rounds for sizes below 32M floats, --large-iters for larger ones;
// --fp32 0 times the CARs alone (no fp32 rounds, no speedup); --piece-blocks
// sets the CARs' pieces (sum blocks each; 0: their own choice, a large
// value: one piece, no overlap of arithmetic and transfers; node-aware: the
// rail allreduce's). --hierarchy (default flat) and --ranks-per-node (default
// 0) as above; --node-reduce 1bit runs the node-aware form's 1-bit node step
// (docs/guides/multi-node.md, default fp32). --threads T: kernel threads per rank (default 1); 0: what a
// config without "threads" gets (the usable cores shared among the ranks on
// them, or OMP_NUM_THREADS).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include "comm/compressed_allreduce.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.hpp"
#include "bench_util.hpp"
#include "car_topology.hpp"
#include "comm/comm.hpp"
#include "comm/node_aware_allreduce.hpp"
#include "kernels/cpu/thread_budget.hpp"
#include "kernels/kernels.hpp"
#include "topology_flag.hpp"

namespace {

using bench::Buffer;

int g_rank = 0, g_world = 1;

[[noreturn]] void fail_all(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "compressed_allreduce_bench: rank %d: %s\n", g_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// Rank r's input: a part shared by all ranks plus a rank-specific part, so
// that the average is not near zero (like momenta of data-parallel replicas).
inline float input_value(int r, int64_t i) {
  return bench::hash_unit(11, i) + 0.5f * bench::hash_unit(100 + uint64_t(r), i);
}


double max_over_ranks(double x) {
  double out = 0.0;
  MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

struct Measured {
  bench::Samples samples;         // slowest rank's seconds per call
  uint64_t comm_bytes = 0;        // this rank's Comm bytes_sent per call
  uint64_t comm_across = 0;       // of which to ranks of other nodes (bytes().inter_node)
  double lo_bytes_per_rank = -1;  // loopback bytes per call / P (rank 0; -1: unknown)
  double link_bytes_per_rank = -1;  // bytes between the emulated nodes per call / P (rank 0; -1: unknown)
};

// Times one call of `op` as the slowest rank sees it; `prepare` runs before,
// untimed. Adds to m.
template <class Prepare, class Op>
void timed_call(dsopt::Comm& comm, Measured& m, bool record, Prepare&& prepare, Op&& op) {
  prepare();
  MPI_Barrier(MPI_COMM_WORLD);
  const long long lo0 = g_rank == 0 ? bench::lo_tx_bytes() : -1;
  const long long link0 = g_rank == 0 && record ? bench::tc_cross_bytes() : -1;
  const dsopt::CommBytes c0 = comm.bytes();
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = bench::now_seconds();
  op();
  const double t = bench::now_seconds() - t0;
  MPI_Barrier(MPI_COMM_WORLD);
  const long long lo1 = g_rank == 0 ? bench::lo_tx_bytes() : -1;
  const long long link1 = link0 >= 0 ? bench::tc_cross_bytes() : -1;
  const double slowest = max_over_ranks(t);
  if (!record) return;
  m.samples.seconds.push_back(slowest);
  const dsopt::CommBytes c = comm.bytes() - c0;
  m.comm_bytes = c.sent;
  m.comm_across = c.inter_node;
  if (g_rank == 0 && lo0 >= 0 && lo1 >= lo0) m.lo_bytes_per_rank = double(lo1 - lo0) / g_world;
  if (link0 >= 0 && link1 >= link0) m.link_bytes_per_rank = double(link1 - link0) / g_world;
}

// The c values at `x` are +/- one scale (one chunk of a 1-bit result).
void check_one_scale(const float* x, int64_t c, const std::string& what) {
  const float s = std::fabs(x[0]);
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t k = 0; k < c; ++k)
    if (std::fabs(x[k]) != s) ++bad;
  if (bad) fail_all(what + " is not +/- one scale");
}

// Every rank holds the same bits in out[0, n) (a strided sample: a cheap
// fingerprint).
void check_same_bits(const float* out, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t k = 0; k < n; k += 4093) {
    uint32_t u;
    std::memcpy(&u, &out[k], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  uint64_t hmin = 0, hmax = 0;
  MPI_Allreduce(&h, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (hmin != hmax) fail_all("ranks hold different results after the compressed allreduce");
}

// Checks the first call of a fresh CAR (errors zero) on input_value: see the
// file comment. `out` is this rank's result, n == n' (sizes are multiples of
// 8P * P here; checked by the caller).
void check_first_call(const float* out, int64_t n) {
  const int P = g_world;
  const int64_t c = n / P;

  // Worker scales of every rank, as each rank computes its own: sum of
  // squares in double, fl(fl(sqrt(sum)) / fl(sqrt(n))). The summation order
  // differs from dsopt's, so the scales may differ in the last bit; the
  // comparisons below allow for that.
  double mine = 0.0;
#pragma omp parallel for reduction(+ : mine) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double v = input_value(g_rank, i);
    mine += v * v;
  }
  std::vector<double> sumsq(static_cast<size_t>(P));
  MPI_Allgather(&mine, 1, MPI_DOUBLE, sumsq.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  const float inv_p = 1.0f / float(P);
  std::vector<float> weight(static_cast<size_t>(P));
  for (int i = 0; i < P; ++i)
    weight[size_t(i)] = (float(std::sqrt(sumsq[size_t(i)])) / float(std::sqrt(double(n)))) * inv_p;

  // Server side of chunk g_rank: z = sum over senders in rank order.
  const int64_t lo = int64_t(g_rank) * c;
  double zsq = 0.0, zmin = INFINITY;
  std::vector<float> z(static_cast<size_t>(c));
#pragma omp parallel for reduction(+ : zsq) reduction(min : zmin) schedule(static)
  for (int64_t k = 0; k < c; ++k) {
    float acc = 0.0f;
    for (int i = 0; i < P; ++i)
      acc += input_value(i, lo + k) < 0.0f ? -weight[size_t(i)] : weight[size_t(i)];
    z[size_t(k)] = acc;
    zsq += double(acc) * double(acc);
    zmin = std::min(zmin, std::fabs(double(acc)));
  }
  const double s_ref = std::sqrt(zsq) / std::sqrt(double(c));

  // Own chunk: signs equal (where z is not within rounding of zero), scale
  // equal to a few ulp.
  const float s_out = std::fabs(out[lo]);
  int64_t bad_sign = 0, bad_mag = 0;
  const float tiny = 1e-5f * float(s_ref);
#pragma omp parallel for reduction(+ : bad_sign, bad_mag) schedule(static)
  for (int64_t k = 0; k < c; ++k) {
    const float o = out[lo + k];
    if (std::fabs(o) != s_out) ++bad_mag;
    const bool neg_ref = z[size_t(k)] < 0.0f;
    if ((o < 0.0f) != neg_ref && std::fabs(z[size_t(k)]) > tiny) ++bad_sign;
  }
  if (bad_mag || bad_sign || !(std::fabs(double(s_out) - s_ref) <= 1e-5 * s_ref))
    fail_all("first call differs from the reference simulation on chunk " + std::to_string(g_rank) +
             ": " + std::to_string(bad_sign) + " signs, " + std::to_string(bad_mag) +
             " magnitudes differ; scale " + std::to_string(s_out) + " vs reference " +
             std::to_string(s_ref));

  // Every chunk is +/- one scale, and all ranks hold the same bits.
  for (int j = 0; j < P; ++j) check_one_scale(out + int64_t(j) * c, c, "output chunk " + std::to_string(j));
  check_same_bits(out, n);
}

// An fp32 allreduce's result against the exact sum of the inputs on a
// sample of elements, or (`mean`) the node-aware allreduce's on one node,
// which compresses nothing, against their mean.
void check_sum(const float* out, int64_t n, bool mean = false) {
  const char* what = mean ? "node-aware allreduce on one node" : "fp32 allreduce";
  for (int64_t k = 0; k < n; k += 9973) {
    double ref = 0.0;
    for (int i = 0; i < g_world; ++i) ref += input_value(i, k);
    if (mean) ref /= g_world;
    if (!(std::fabs(double(out[k]) - ref) <= 1e-5 * (std::fabs(ref) + 1.0)))
      fail_all(std::string(what) + ": element " + std::to_string(k) + " is " + std::to_string(out[k]) +
               ", expected " + std::to_string(ref));
  }
}

// The node-aware allreduce's first call on nodes of R ranks: slice j
// (m = ceil(n / R) values from j m) is rail j's flat result over N ranks,
// N chunks of padded_length(m, N) / N values (the last ones cut by n),
// each +/- one scale; on one node (nothing compressed) the fp32 mean;
// all ranks hold the same bits.
void check_node_aware_first_call(const float* out, int64_t n, int nodes, int ranks_per_node,
                                 bool onebit_node) {
  if (nodes == 1) {
    check_sum(out, n, true);
    check_same_bits(out, n);
    return;
  }
  const int64_t m = dsopt::NodeAwareAllreduce::slice_length(n, ranks_per_node, onebit_node);
  const int64_t c = dsopt::CompressedAllreduce::padded_length(m, nodes) / nodes;
  for (int j = 0; j < ranks_per_node; ++j)
    for (int k = 0; k < nodes; ++k) {
      const int64_t lo = int64_t(j) * m + int64_t(k) * c;
      const int64_t hi = std::min({lo + c, int64_t(j + 1) * m, n});
      if (hi > lo)
        check_one_scale(out + lo, hi - lo,
                        "slice " + std::to_string(j) + ", chunk " + std::to_string(k) + " of the node-aware result");
    }
  check_same_bits(out, n);
}

// Relative L2 distance of the CAR output from the exact average (first
// call): what one call of 1-bit compression loses before error feedback
// makes it up over later calls.
double relative_error_vs_mean(const float* out, int64_t n) {
  double num = 0.0, den = 0.0;
#pragma omp parallel for reduction(+ : num, den) schedule(static)
  for (int64_t k = 0; k < n; ++k) {
    double mean = 0.0;
    for (int i = 0; i < g_world; ++i) mean += input_value(i, k);
    mean /= g_world;
    num += (double(out[k]) - mean) * (double(out[k]) - mean);
    den += mean * mean;
  }
  return std::sqrt(num / den);
}

// Error feedback: calls on the same input, with the errors carried from call
// to call, must average out to the exact mean (the 1-bit error of one call
// is large, that of the running average shrinks like 1/calls). On a fresh
// allreduce of n elements (padded: n need not be a multiple of anything),
// `run` (float** of one tensor); returns the relative L2 error of one call
// and of the average of `calls` calls.
template <class Run>
std::pair<double, double> check_error_feedback(Run&& run, int64_t n, int calls) {
  std::vector<float> x(static_cast<size_t>(n));
  std::vector<double> sum(static_cast<size_t>(n), 0.0), mean(static_cast<size_t>(n), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < g_world; ++i) mean[size_t(k)] += input_value(i, k);
    mean[size_t(k)] /= g_world;
  }
  auto rel_err = [&](int count) {
    double num = 0.0, den = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      const double d = sum[size_t(k)] / count - mean[size_t(k)];
      num += d * d;
      den += mean[size_t(k)] * mean[size_t(k)];
    }
    return std::sqrt(num / den);
  };
  double first = 0.0;
  for (int c = 1; c <= calls; ++c) {
    for (int64_t k = 0; k < n; ++k) x[size_t(k)] = input_value(g_rank, k);
    float* p = x.data();
    run(&p);
    for (int64_t k = 0; k < n; ++k) sum[size_t(k)] += x[size_t(k)];
    if (c == 1) first = rel_err(1);
  }
  const double avg = rel_err(calls);
  if (!(avg < 0.25 * first))
    fail_all("error feedback: the average of " + std::to_string(calls) +
             " calls is off the mean by " + std::to_string(avg) +
             " (one call: " + std::to_string(first) + ")");
  return {first, avg};
}

// counted: whether m's bytes went through the Comm (its counters are shown);
// f: the formulas' bytes, sent and across nodes (across_known: whether the
// nodes are equal, so that the count across them has a formula).
void print_row(const char* name, const Measured& m, const bench::CallBytes& f, bool across_known,
               double ref_median, bool counted = true) {
  char comm_bytes[32] = "-", comm_across[32] = "-", form_across[32] = "-";
  if (counted) {
    std::snprintf(comm_bytes, sizeof comm_bytes, "%.5g", double(m.comm_bytes));
    std::snprintf(comm_across, sizeof comm_across, "%.5g", double(m.comm_across));
  }
  if (across_known) std::snprintf(form_across, sizeof form_across, "%.5g", double(f.across));
  char lo[32] = "-", link[32] = "-";
  if (m.lo_bytes_per_rank >= 0) std::snprintf(lo, sizeof lo, "%.4g", m.lo_bytes_per_rank);
  if (m.link_bytes_per_rank >= 0) std::snprintf(link, sizeof link, "%.4g", m.link_bytes_per_rank);
  char speed[16] = "-";
  if (ref_median > 0) std::snprintf(speed, sizeof speed, "%.1fx", ref_median / m.samples.median());
  std::printf("  %-16s %10.4f %10.4f %12s %12.5g %12s %12s %10s %10s %8s\n", name, m.samples.median(),
              m.samples.best(), comm_bytes, double(f.sent), comm_across, form_across, lo, link, speed);
  std::fflush(stdout);
}

// Fails unless the Comm counted what the formulas say (across nodes: where
// they have a formula).
void check_bytes(const char* name, const Measured& m, const bench::CallBytes& f, bool across_known) {
  if (m.comm_bytes != f.sent || (across_known && m.comm_across != f.across))
    fail_all(std::string(name) + ": the Comm counted " + std::to_string(m.comm_bytes) + " bytes sent, " +
             std::to_string(m.comm_across) + " across nodes per call; the formulas (" +
             "docs/design/compressed-allreduce.md section 7, src/comm/node_aware_allreduce.hpp) say " +
             std::to_string(f.sent) + " and " + std::to_string(f.across));
}

void run_size(dsopt::Comm& comm, dsopt::Kernels& kernels, const bench::CarTopology& topo, int64_t n,
              int iters, int warmup, bool with_fp32, int64_t piece_blocks) {
  const int P = g_world;
  const dsopt::Mem mem{&kernels, false};
  Buffer<float> input = bench::alloc_buffer<float>(n), x = bench::alloc_buffer<float>(n);
  bench::parallel_fill(input.get(), n, [](int64_t i) { return input_value(g_rank, i); });
  auto restore = [&] { std::memcpy(x.get(), input.get(), size_t(n) * 4); };

  dsopt::CompressedAllreduce car(comm, kernels, mem, {n}, piece_blocks);
  const int64_t padded = dsopt::CompressedAllreduce::padded_length(n, P);
  if (padded != n) fail_all("internal: size not a multiple of P * lcm(P, 8)");
  std::unique_ptr<dsopt::NodeAwareAllreduce> aware;
  if (topo.node_aware)
    aware = std::make_unique<dsopt::NodeAwareAllreduce>(*topo.comms.node, *topo.comms.rail, kernels, mem,
                                                        std::vector<int64_t>{n}, topo.onebit_node, piece_blocks);

  // Correctness first (fresh allreduces: errors are zero).
  restore();
  float* xp = x.get();
  car.run(&xp);
  check_first_call(x.get(), n);
  const double rel_err = relative_error_vs_mean(x.get(), n);
  double aware_err = -1;
  if (aware) {
    restore();
    aware->run(&xp);
    check_node_aware_first_call(x.get(), n, topo.nodes(), topo.ranks_per_node(), topo.onebit_node);
    aware_err = relative_error_vs_mean(x.get(), n);
  }
  restore();
  comm.allreduce(x.get(), x.get(), size_t(n), dsopt::Elem::F32, dsopt::ReduceOp::Sum, mem);
  check_sum(x.get(), n);

  Measured fp32, mpi, onebit, onebit_aware;
  for (int it = 0; it < warmup + iters; ++it) {
    const bool record = it >= warmup;
    if (with_fp32) {
      timed_call(comm, fp32, record, restore, [&] {
        comm.allreduce(x.get(), x.get(), size_t(n), dsopt::Elem::F32, dsopt::ReduceOp::Sum, mem);
      });
      timed_call(comm, mpi, record, restore, [&] {
        MPI_Allreduce(MPI_IN_PLACE, x.get(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
    }
    timed_call(comm, onebit, record, restore, [&] {
      float* p = x.get();
      car.run(&p);
    });
    if (aware)
      timed_call(comm, onebit_aware, record, restore, [&] {
        float* p = x.get();
        aware->run(&p);
      });
  }

  const bench::CallBytes fp32_formula = bench::fp32_bytes(n, topo), car_formula = bench::flat_car_bytes(n, topo),
                         aware_formula = bench::node_aware_car_bytes(n, topo);
  const bool across = topo.equal_nodes();
  if (g_rank == 0) {
    std::printf("n = %lld floats (%.0f MiB per rank), %d timed rounds after %d warm-up, CAR in %lld pieces",
                static_cast<long long>(n), double(n) * 4 / (1 << 20), iters, warmup,
                static_cast<long long>(car.pieces()));
    if (aware)
      std::printf(", node-aware rail allreduce in %lld", static_cast<long long>(aware->rail_allreduce().pieces()));
    std::printf(":\n  %-16s %10s %10s %12s %12s %12s %12s %10s %10s %8s\n", "operation", "median s", "best s",
                "B/rank Comm", "B/rank form.", "across Comm", "across form.", "B/rank lo", "B/rk link",
                "speedup");
    const double ref = with_fp32 ? fp32.samples.median() : -1;
    if (with_fp32) {
      print_row("fp32 allreduce", fp32, fp32_formula, across, -1);
      print_row("MPI_Allreduce", mpi, fp32_formula, across, -1, false);
    }
    print_row("1-bit CAR", onebit, car_formula, across, ref);
    if (aware) print_row("1-bit node-aware", onebit_aware, aware_formula, across, ref);
    std::printf("  bytes ratio (formula) %.1fx", double(fp32_formula.sent) / double(car_formula.sent));
    if (aware && car_formula.across > 0)
      std::printf("; across nodes node-aware / flat %.3f (formula)",
                  double(aware_formula.across) / double(car_formula.across));
    std::printf(
        "\n  checked: first CAR call matches the reference simulation (relative L2 error\n"
        "  vs the exact mean %.3f), fp32 sum exact\n",
        rel_err);
    if (aware)
      std::printf("  node-aware first call: %s, the same bits on every\n"
                  "  rank (relative L2 error vs the exact mean %.3g)\n",
                  topo.nodes() > 1 ? "one scale per chunk of every slice" : "the fp32 mean (one node)",
                  aware_err);
    if (with_fp32 && fp32.lo_bytes_per_rank > 0 && onebit.lo_bytes_per_rank > 0) {
      const double rate = fp32.lo_bytes_per_rank * P / fp32.samples.median();  // B/s on lo
      const double wire = onebit.lo_bytes_per_rank * P / rate;
      std::printf(
          "  lo throughput during the fp32 allreduce %.1f MB/s; at that rate the CAR's\n"
          "  bytes take %.4f s of its %.4f s; the rest (%.4f s) is computation and\n"
          "  latency not hidden behind the transfers\n",
          1e-6 * rate, wire, onebit.samples.median(), onebit.samples.median() - wire);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  if (with_fp32) check_bytes("fp32 allreduce", fp32, fp32_formula, across);
  check_bytes("1-bit CAR", onebit, car_formula, across);
  if (aware) check_bytes("1-bit node-aware", onebit_aware, aware_formula, across);
}

// The threads dsopt_create gives a config without "threads": the usable
// cores shared among the ranks on the same machine and cores.
int budget_threads() {
  const dsopt::CpuPlace place = dsopt::this_cpu_place();
  const uint64_t mine[2] = {place.machine, place.cores};
  std::vector<uint64_t> all(2 * size_t(g_world));
  MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, MPI_COMM_WORLD);
  int peers = 0;
  for (int r = 0; r < g_world; ++r) peers += all[2 * size_t(r)] == mine[0] && all[2 * size_t(r) + 1] == mine[1];
  return dsopt::default_threads(place, peers);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);

  bench::Flags flags(argc, argv);
  const int64_t min_numel = flags.get("--min-numel", 0, 0, int64_t(1) << 30);
  const int64_t max_numel = flags.get("--max-numel", int64_t(64) << 20, 1, int64_t(1) << 30);
  const int iters = int(flags.get("--iters", 5, 1, 1000));
  const int large_iters = int(flags.get("--large-iters", 3, 1, 1000));
  const int warmup = int(flags.get("--warmup", 1, 0, 1000));
  // --threads 0: what a config without "threads" gets (thread_budget.hpp).
  const int threads = int(flags.get("--threads", 1, 0, 256));
  const bool with_fp32 = flags.get("--fp32", 1, 0, 1) != 0;
  const int64_t piece_blocks = flags.get("--piece-blocks", 0, 0, int64_t(1) << 40);
  const std::string hierarchy = flags.text("--hierarchy", "flat");
  const int ranks_per_node = int(flags.get("--ranks-per-node", 0, 0, 1 << 20));
  const std::string node_reduce = flags.text("--node-reduce", "fp32");
  flags.finish(
      "compressed_allreduce_bench [--min-numel N] [--max-numel N] [--iters I] [--large-iters L]"
      " [--warmup W] [--threads T] [--fp32 0|1] [--piece-blocks B]"
      " [--hierarchy flat|node_aware|auto] [--ranks-per-node R] [--node-reduce fp32|1bit]");
  const int kernel_threads = threads > 0 ? threads : budget_threads();
  omp_set_num_threads(kernel_threads);
  if (g_world < 2) fail_all("needs at least 2 MPI ranks (mpirun -np 4)");

  try {
    std::unique_ptr<dsopt::Comm> comm = dsopt::make_mpi_comm(MPI_Comm_c2f(MPI_COMM_WORLD));
    std::unique_ptr<dsopt::Kernels> kernels = dsopt::make_cpu_kernels(kernel_threads);
    comm->prepare();
    const bench::CarTopology topo = bench::car_topology(*comm, hierarchy, ranks_per_node, node_reduce);
    if (g_rank == 0) {
      std::printf("1-bit compressed allreduce vs fp32 MPI_Allreduce, %d ranks\n", g_world);
      std::printf("nodes:   %s%s\n", topo.describe().c_str(),
                  ranks_per_node > 0 ? " (declared)" : " (MPI's shared-memory split)");
      std::printf("dsopt:   %s\n", dsopt_build_info());
      std::printf("machine: %s; %d CPU kernel thread(s) per rank%s\n", bench::cpu_model().c_str(),
                  kernel_threads, threads > 0 ? "" : " (the default config's thread budget)");
      std::printf("network: %s\n",
                  bench::env_or("DSOPT_BENCH_NETWORK", "not described (set DSOPT_BENCH_NETWORK)"));
      std::printf(
          "columns: seconds per call (slowest rank; median, best); bytes sent per rank per\n"
          "         call from the Comm counter and from the formula, of them to ranks of\n"
          "         other nodes (across) from the Comm counter and from the formula, from\n"
          "         the loopback device (all ranks' bytes on lo incl. headers / P) and\n"
          "         between the emulated nodes (link: bench/netem_two_nodes.sh's htb\n"
          "         counters, both directions, incl. headers / P); speedup = fp32\n"
          "         median / CAR median\n\n");
      std::fflush(stdout);
    }
    const int64_t ef_n = (int64_t(1) << 20) - 3;
    const int ef_calls = 40;
    const dsopt::Mem mem{kernels.get(), false};
    dsopt::CompressedAllreduce ef_car(*comm, *kernels, mem, {ef_n});
    const std::pair<double, double> ef =
        check_error_feedback([&](float** x) { ef_car.run(x); }, ef_n, ef_calls);
    std::pair<double, double> ef_aware{-1, -1};
    if (topo.node_aware && topo.nodes() > 1) {  // one node compresses nothing
      dsopt::NodeAwareAllreduce ef_na(*topo.comms.node, *topo.comms.rail, *kernels, mem, {ef_n}, topo.onebit_node);
      ef_aware = check_error_feedback([&](float** x) { ef_na.run(x); }, ef_n, ef_calls);
    }
    if (g_rank == 0) {
      std::printf(
          "checked: error feedback (%lld floats, padded): the average of %d calls on the same\n"
          "         input is off the exact mean by %.4f (relative L2), one call by %.4f\n",
          static_cast<long long>(ef_n), ef_calls, ef.second, ef.first);
      if (topo.node_aware && topo.nodes() > 1)
        std::printf("         node-aware: the average by %.4f, one call by %.4f\n", ef_aware.second,
                    ef_aware.first);
      std::printf("\n");
      std::fflush(stdout);
    }
    // Sizes are rounded down to a multiple of DeepSpeed's padding unit
    // P * lcm(P, 8) (no change for P = 4), so that the checks need no padding.
    const int64_t unit = dsopt::CompressedAllreduce::padded_length(1, g_world);
    for (int64_t n : {int64_t(1) << 20, int64_t(16) << 20, int64_t(64) << 20}) {
      n -= n % unit;
      if (n < min_numel || n > max_numel) continue;
      run_size(*comm, *kernels, topo, n, n >= (int64_t(32) << 20) ? large_iters : iters, warmup, with_fp32,
               piece_blocks);
    }
  } catch (const std::exception& e) {
    fail_all(e.what());
  }
  MPI_Finalize();
  return 0;
}
