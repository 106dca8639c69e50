// Compressed ZeRO-2 (docs/guides/compressed-zero.md) against uncompressed
// ZeRO-2, AdamW, through the public C API on every rank of MPI_COMM_WORLD.
//
// The model is zero_e2e_bench's (zero_model.hpp): Psi elements in --tensors
// tensors of odd sizes; AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
// weight decay 0.01), "threads" --threads, "zero_optimization": {"stage":
// 2, "reduce_bucket_size": --bucket, "allgather_bucket_size": --ag-bucket,
// "compression": {"gradients": G, "parameters": W, "gradient_block_size":
// --block, "parameter_block_size": --param-block, "error_feedback": true}};
// G = W = "none" is uncompressed ZeRO-2.
// Gradients are fixed and different on every rank (zero_e2e_bench's).
//
// Part 1, bytes and memory (--bytes-numel Psi; 0 leaves it out), for fp32
// and bf16 parameters and every pair of G in none, int8, int4, sign and W
// in none, bf16, int8: one optimizer at a time steps 4 times; reported are
// info.bytes_sent of the last step (per rank; checked on every rank against
//   handshake 2 (N-1)/N * 16 + status/norm allreduce 2 (N-1)/N * 16
//   + per bucket of n elements (piece m = n/N): none (N-1) 4 m, else the
//     all-to-all of the encoded pieces (N-1) R(m)
//   + per allgather chunk of L elements: none (N-1) L w (w = 2 for bf16,
//     4 for fp32 parameters), bf16 (N-1) 2 L, int8 (N-1) R(L),
// R(m) = ceil(m / block) (4 + block b / 8), b the codec's bits, block
// --block for gradients, --param-block for parameters), its ratio
// to uncompressed ZeRO-2, and dsopt_memory_usage (checked against the
// formula of the guide's "Memory": uncompressed ZeRO-2's allocation, its
// one buffer max(4 B, N R(m) of pieces encoded aside, the allgather's
// part), plus max(R(largest piece), N R(m) aside) and, with feedback,
// twice the int8 runs R8 of every bucket's pieces for a gradient codec; masters of
// all S shard elements for a parameter codec, whose part of the buffer is
// (N + 1) C(L) + 4 L, C(L) = 2 L for bf16, R(L) for int8, against w L (N + 1)
// without one), and the rank's total with the caller's parameters and
// gradients.
//
// Part 2, step time (--numel Psi; 0 leaves it out), for fp32 and bf16
// parameters: uncompressed ZeRO-2 and each pair of --time-pairs
// ("G/W,G/W,..."), two optimizers on copies of the same parameters
// stepped alternately (--warmup untimed, then --steps timed rounds), so
// that whatever else the machine does falls on both alike. Step time =
// dsopt_step of the slowest rank, after a barrier; reported: median, min,
// max, the ratio uncompressed / compressed of the medians, and bytes_sent.
// Checked: every rank ends with the same parameters in every run.
//
//   compressed_zero_bench [--bytes-numel N] [--numel N] [--tensors T]
//       [--bucket E] [--ag-bucket E] [--block B] [--param-block B] [--warmup W] [--steps S]
//       [--threads T] [--fp32 0|1] [--bf16 0|1] [--time-pairs G/W,...]
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "topology_flag.hpp"
#include "mpi_fail.hpp"
#include "zero_model.hpp"

namespace {

using namespace zero_model;

int g_rank = 0, g_world = 1;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kBytesSteps = 4;  // the replication checks of the first 3 steps are over

[[noreturn]] void fail_all(const std::string& what) {
  bench::fail_all("compressed_zero_bench", g_rank, what);
}

#define CZ_CHECK(call)                                                \
  do {                                                               \
    const std::string failure_ = bench::call_failure((call), #call); \
    if (!failure_.empty()) fail_all(failure_);                       \
  } while (0)

struct Pair {
  std::string grads = "none", params = "none";
  std::string name() const { return grads + "/" + params; }
  bool plain() const { return grads == "none" && params == "none"; }
};

struct Options {
  int64_t bytes_numel, numel, bucket, ag_bucket, block, param_block;
  int tensors, warmup, steps, threads;
  bool fp32, bf16;
  std::vector<Pair> time_pairs;
  std::string hierarchy;  // --hierarchy: the "topology" key ("" leaves it out)
  long long ranks_per_node = 0;
};

std::string config(const Options& o, const Pair& p) {
  char c[768];
  std::snprintf(c, sizeof c,
                "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"betas\": [0.9, 0.999],"
                " \"eps\": 1e-8, \"weight_decay\": 0.01}}, \"threads\": %d, \"zero_optimization\":"
                " {\"stage\": 2, \"reduce_bucket_size\": %lld, \"allgather_bucket_size\": %lld,"
                " \"compression\": {\"gradients\": \"%s\", \"parameters\": \"%s\","
                " \"gradient_block_size\": %lld, \"parameter_block_size\": %lld, \"error_feedback\": true}}}",
                o.threads, static_cast<long long>(o.bucket), static_cast<long long>(o.ag_bucket),
                p.grads.c_str(), p.params.c_str(), static_cast<long long>(o.block),
                static_cast<long long>(o.param_block));
  return bench::with_topology(c, o.hierarchy, o.ranks_per_node);
}

int bits(const std::string& codec) { return codec == "int8" ? 8 : codec == "int4" ? 4 : 1; }

// R(m): an encoded run of m elements.
uint64_t run_bytes(const std::string& codec, int64_t block, int64_t m) {
  return uint64_t((m + block - 1) / block) * uint64_t(4 + block * bits(codec) / 8);
}

uint64_t chunk_bytes(const std::string& codec, int64_t block, int64_t len, int w) {
  if (codec == "none") return uint64_t(len) * uint64_t(w);
  if (codec == "bf16") return uint64_t(len) * 2;
  return run_bytes("int8", block, len);
}

uint64_t bytes_formula(const Layout& L, int P, bool half, const Pair& p, int64_t block,
                       int64_t param_block) {
  const uint64_t N = uint64_t(P);
  uint64_t b = 2 * (2 * (N - 1) * 16 / N);  // handshake, status/norm
  for (int64_t start = 0; start < L.padded; start += L.bucket) {
    const int64_t piece = std::min(L.bucket, L.padded - start) / P;
    b += (N - 1) * (p.grads == "none" ? uint64_t(piece) * 4 : run_bytes(p.grads, block, piece));
  }
  for (int64_t c = 0; c < L.ag_chunks; ++c)
    b += (N - 1) * chunk_bytes(p.params, param_block, std::min(L.ag_len, L.shard - c * L.ag_len), half ? 2 : 4);
  return b;
}

double memory_formula(const Layout& L, int P, bool half, const Pair& p, int64_t block,
                      int64_t param_block) {
  Expected e = expected_zero(L, P, g_rank, half, false, 0);
  if (P > 1 && p.grads != "none") {
    // Pieces with R(m) > 2 m are encoded aside (N R(m)) and received into
    // the buffer; the others in their bucket's buffer, piece 0 aside (R(m)).
    double aside = 0.0, residual = 0.0;  // residual: int8 runs of every bucket's pieces
    for (int64_t start = 0; start < L.padded; start += L.bucket) {
      const int64_t piece = std::min(L.bucket, L.padded - start) / P;
      if (run_bytes(p.grads, block, piece) > uint64_t(2 * piece))
        aside = std::max(aside, double(P) * double(run_bytes(p.grads, block, piece)));
      residual += double(P) * double(run_bytes("int8", block, piece));
    }
    e.reduce_buf = std::max(e.reduce_buf, aside);
    e.lamb += std::max(double(run_bytes(p.grads, block, L.largest_bucket / P)), aside);
    e.lamb += 2.0 * residual;  // the residual and its pending copy
  }
  if (P > 1 && p.params != "none") {
    e.masters = 4.0 * double(L.shard);
    e.ag_buf = double(P + 1) * double(chunk_bytes(p.params, param_block, L.ag_len, 0)) + 4.0 * double(L.ag_len);
  }
  return e.total();
}

// ---- part 1 -------------------------------------------------------------------

void run_bytes_and_memory(const Options& o, dsopt_comm* comm, bool half) {
  const int P = g_world;
  const std::vector<int64_t> sizes = model_sizes(o.bytes_numel, o.tensors, fail_all);
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  const Layout L(n, P, o.bucket, o.ag_bucket);
  Flat init(half, n), p(half, n), g(half, n);
  init.fill_params();
  g.fill_grads(g_rank);
  const std::vector<dsopt_tensor> pv = p.views(sizes), gv = g.views(sizes);
  if (g_rank == 0) {
    std::printf("== bytes and memory per rank: %s parameters, Psi = %lld in %d tensors, %d ranks,"
                " blocks %lld (gradients) and %lld (parameters) ==\n", half ? "bf16" : "fp32",
                static_cast<long long>(n), o.tensors, P, static_cast<long long>(o.block),
                static_cast<long long>(o.param_block));
    std::printf("%-6s %-6s %13s %9s %11s %9s %10s %9s\n", "grads", "params", "bytes/step", "x fewer",
                "dsopt MiB", "x ZeRO-2", "rank MiB", "x ZeRO-2");
  }
  uint64_t plain_bytes = 0;
  double plain_mem = 0.0;
  for (const char* gc : {"none", "int8", "int4", "sign"}) {
    for (const char* wc : {"none", "bf16", "int8"}) {
      const Pair pair{gc, wc};
      std::memcpy(p.bytes.get(), init.bytes.get(), init.size());
      dsopt_optimizer* opt = nullptr;
      const std::string c = config(o, pair);
      CZ_CHECK(dsopt_create(&opt, c.c_str(), comm, pv.data(), int64_t(pv.size())));
      dsopt_step_info info{};
      for (int k = 0; k < kBytesSteps; ++k) info = checked_step(opt, gv, fail_all);
      const uint64_t mem = host_usage(opt, fail_all);
      dsopt_destroy(opt);
      same_on_every_rank(p, pair.name(), fail_all);
      const uint64_t want = bytes_formula(L, P, half, pair, o.block, o.param_block);
      const double want_mem = memory_formula(L, P, half, pair, o.block, o.param_block);
      if (info.bytes_sent != want)
        fail_all(pair.name() + ": sent " + std::to_string(info.bytes_sent) + " bytes (formula " +
                 std::to_string(want) + ")");
      if (double(mem) != want_mem)
        fail_all(pair.name() + ": dsopt_memory_usage " + std::to_string(mem) + " (formula " +
                 std::to_string(uint64_t(want_mem)) + ")");
      if (pair.plain()) {
        plain_bytes = info.bytes_sent;
        plain_mem = double(mem);
      }
      // The rank's total: the caller's parameters and gradients besides dsopt's.
      const double caller = 2.0 * double(p.size());
      if (g_rank == 0)
        std::printf("%-6s %-6s %13llu %9.2f %11.1f %9.2f %10.1f %9.2f\n", gc, wc,
                    static_cast<unsigned long long>(info.bytes_sent),
                    double(plain_bytes) / double(info.bytes_sent), double(mem) / kMiB,
                    double(mem) / plain_mem, (caller + double(mem)) / kMiB,
                    (caller + double(mem)) / (caller + plain_mem));
    }
  }
  if (g_rank == 0) {
    std::printf("checked: bytes_sent and dsopt_memory_usage = the formulas on every rank; identical"
                " parameters on every rank\n\n");
    std::fflush(stdout);
  }
}

// ---- part 2 -------------------------------------------------------------------

double slowest_step(dsopt_optimizer* opt, const std::vector<dsopt_tensor>& g, uint64_t* bytes,
                    long long* inter = nullptr, long long* wire = nullptr) {
  const long long w0 = g_rank == 0 && wire ? bench::tc_cross_bytes() : -1;
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = bench::now_seconds();
  const dsopt_step_info info = checked_step(opt, g, fail_all);
  *bytes = info.bytes_sent;
  if (inter) *inter = bench::inter_node_bytes(info);
  const double mine = bench::now_seconds() - t0;
  double slowest = 0.0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (wire) *wire = w0 < 0 ? -1 : bench::tc_cross_bytes() - w0;
  return slowest;
}

void run_timing(const Options& o, dsopt_comm* comm, bool half) {
  const int P = g_world;
  const std::vector<int64_t> sizes = model_sizes(o.numel, o.tensors, fail_all);
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  Flat p0(half, n), p1(half, n), g(half, n);
  p0.fill_params();
  g.fill_grads(g_rank);
  const std::vector<dsopt_tensor> v0 = p0.views(sizes), v1 = p1.views(sizes), gv = g.views(sizes);
  if (g_rank == 0) {
    std::printf("== step time: %s parameters, Psi = %lld in %d tensors, %d ranks, %d warmup + %d"
                " timed rounds, alternating with uncompressed ZeRO-2 ==\n",
                half ? "bf16" : "fp32", static_cast<long long>(n), o.tensors, P, o.warmup, o.steps);
    std::printf("%-11s %9s %9s %9s %9s %13s | %9s %9s\n", "grads/par", "median s", "min s", "max s",
                "Z2/this", "bytes/step", "Z2 med s", "Z2 bytes");
  }
  for (const Pair& pair : o.time_pairs) {
    p0.fill_params();
    std::memcpy(p1.bytes.get(), p0.bytes.get(), p0.size());
    dsopt_optimizer *plain = nullptr, *packed = nullptr;
    const std::string c0 = config(o, Pair{}), c1 = config(o, pair);
    CZ_CHECK(dsopt_create(&plain, c0.c_str(), comm, v0.data(), int64_t(v0.size())));
    CZ_CHECK(dsopt_create(&packed, c1.c_str(), comm, v1.data(), int64_t(v1.size())));
    std::vector<double> t0, t1;
    uint64_t b0 = 0, b1 = 0;
    long long x0 = -1, x1 = -1, w0 = -1, w1 = -1;
    for (int round = 0; round < o.warmup + o.steps; ++round) {
      const double a = slowest_step(plain, gv, &b0, &x0, &w0), b = slowest_step(packed, gv, &b1, &x1, &w1);
      if (round < o.warmup) continue;
      t0.push_back(a);
      t1.push_back(b);
    }
    dsopt_destroy(plain);
    dsopt_destroy(packed);
    same_on_every_rank(p0, "uncompressed", fail_all);
    same_on_every_rank(p1, pair.name(), fail_all);
    if (g_rank == 0) {
      const bench::Samples s0{t0}, s1{t1};
      std::printf("%-11s %9.3f %9.3f %9.3f %9.2f %13llu | %9.3f %9llu\n", pair.name().c_str(),
                  s1.median(), s1.best(), *std::max_element(t1.begin(), t1.end()),
                  s0.median() / s1.median(),
                  static_cast<unsigned long long>(b1), s0.median(), static_cast<unsigned long long>(b0));
      // Per step of rank 0, for scripts: bytes across node boundaries
      // (info.bytes_inter_node; "n/a" where the library does not report
      // them), and every timed step's time.
      auto cross = [](long long x) { return x < 0 ? std::string("n/a") : std::to_string(x); };
      std::printf("inter_node: %s %s | ZeRO-2 %s\n", pair.name().c_str(), cross(x1).c_str(), cross(x0).c_str());
      // The emulated link's counters over the last timed step of each
      // (bench/netem_two_nodes.sh; both directions, headers included).
      std::printf("wire_cross: %s %s | ZeRO-2 %s\n", pair.name().c_str(), cross(w1).c_str(), cross(w0).c_str());
      std::printf("samples: %s", pair.name().c_str());
      for (double t : t1) std::printf(" %.4f", t);
      std::printf(" | ZeRO-2");
      for (double t : t0) std::printf(" %.4f", t);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (g_rank == 0) std::printf("checked: identical parameters on every rank in every run\n\n");
}

std::vector<Pair> parse_pairs(const std::string& text) {
  std::vector<Pair> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const size_t slash = item.find('/');
    if (slash == std::string::npos) fail_all("--time-pairs: \"" + item + "\" is not G/W");
    out.push_back(Pair{item.substr(0, slash), item.substr(slash + 1)});
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const char* usage =
      "compressed_zero_bench [--bytes-numel N] [--numel N] [--tensors T] [--bucket E]"
      " [--ag-bucket E] [--block B] [--param-block B] [--warmup W] [--steps S] [--threads T] [--fp32 0|1]"
      " [--bf16 0|1] [--time-pairs G/W,...] [--hierarchy auto|flat|node_aware] [--ranks-per-node R]";
  bench::Flags flags(argc, argv);
  Options o;
  o.bytes_numel = flags.get("--bytes-numel", int64_t(1) << 22, 0, int64_t(1) << 34);
  o.numel = flags.get("--numel", int64_t(1) << 24, 0, int64_t(1) << 34);
  o.tensors = int(flags.get("--tensors", 36, 1, 100000));
  o.bucket = flags.get("--bucket", int64_t(1) << 22, 1, int64_t(1) << 40);
  o.ag_bucket = flags.get("--ag-bucket", int64_t(1) << 22, 1, int64_t(1) << 40);
  o.block = flags.get("--block", 64, 8, 65536);
  o.param_block = flags.get("--param-block", 256, 8, 65536);
  o.warmup = int(flags.get("--warmup", 1, 0, 1000000));
  o.steps = int(flags.get("--steps", 5, 1, 1000000));
  o.threads = int(flags.get("--threads", 1, 1, 256));
  o.fp32 = flags.get("--fp32", 1, 0, 1) != 0;
  o.bf16 = flags.get("--bf16", 1, 0, 1) != 0;
  o.time_pairs = parse_pairs(flags.text("--time-pairs", "int4/int8,int8/bf16,int8/int8,sign/int8,int4/none"));
  o.hierarchy = flags.text("--hierarchy", "");
  o.ranks_per_node = flags.get("--ranks-per-node", 0, 0, 1 << 20);
  flags.finish(usage);
  omp_set_num_threads(o.threads);

  if (g_rank == 0) {
    std::printf("Compressed ZeRO-2 vs uncompressed ZeRO-2, AdamW, %d ranks\n", g_world);
    std::printf("dsopt:   %s\n", dsopt_build_info());
    std::printf("machine: %s; %ld cores online, shared by the %d ranks; %d thread(s) per rank\n",
                bench::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), g_world, o.threads);
    std::printf("network: %s\n",
                bench::env_or("DSOPT_BENCH_NETWORK", "not described (set DSOPT_BENCH_NETWORK)"));
    std::printf("config:  %s\n\n", config(o, Pair{"int4", "int8"}).c_str());
    std::fflush(stdout);
  }
  dsopt_comm* comm = nullptr;
  CZ_CHECK(dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)));
  for (const bool half : {false, true}) {
    if ((half && !o.bf16) || (!half && !o.fp32)) continue;
    if (o.bytes_numel > 0) run_bytes_and_memory(o, comm, half);
  }
  for (const bool half : {false, true}) {
    if ((half && !o.bf16) || (!half && !o.fp32)) continue;
    if (o.numel > 0) run_timing(o, comm, half);
  }
  dsopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
