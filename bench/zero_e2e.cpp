// ZeRO stage 1/2 against stage 0 for AdamW (or LAMB, --lamb 1), through the
// public C API, on every rank of MPI_COMM_WORLD: what each rank holds, and
// what a step costs.
//
// The model: --numel elements (Psi) in --tensors tensors of odd sizes (a
// few large "weight matrices" and many small ones, the last tensor taking
// the rest; Psi grows by one when the count of odd sizes cannot add up to
// it). Every optimizer is AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
// weight decay 0.01), or with --lamb 1 LAMB with the same settings,
// "threads" --threads, with
//   stage 0   no "zero_optimization"
//   ZeRO-1/2  "zero_optimization": {"stage": 1|2, "reduce_bucket_size":
//             --bucket, "allgather_bucket_size": --ag-bucket} (reduce_scatter
//             true, the default)
//
// Part 1, memory (--mem-numel Psi, bf16 parameters and bf16 gradients; 0
// leaves it out). For stage 0, ZeRO-1 and ZeRO-2 in turn, on every rank:
//   - dsopt_memory_usage host bytes after dsopt_create and after one
//     dsopt_step (stage 0 allocates its averaged-gradient buffer in its
//     first step),
//   - the formula of what the code allocates (src/zero/*.hpp; N ranks,
//     n' = Psi padded to a multiple of 2N, S = n'/N):
//       stage 0: masters 4 Psi + moments 8 Psi + averaged gradients 4 (Psi + 1)
//                (N > 1)
//       ZeRO:    masters 4 (Psi's elements in the shard, padding excluded)
//                + moments 8 S + gradient shard 4 S
//                + one scratch buffer (N > 1) that holds a reduce bucket, then
//                  an allgather chunk: max(4 min(B, n'), (N + 1) L w), with
//                  B = --bucket rounded down to a multiple of 2N,
//                  L = min(S, --ag-bucket/N), w = 2 (all parameters 16-bit),
//       LAMB adds its direction u (stage 0: 4 Psi; ZeRO: 4 S) and, under
//       ZeRO, the rebuilt sum blocks of p and u (8 C, C the elements of the
//       4,096-element blocks from each tensor's start that no one bucket
//       piece holds whole; src/zero/shard_tensor_sums.hpp),
//     printed next to the textbook 12 Psi/N + 4 Psi/N + the same buffer,
//   - the process's resident memory (/proc/self/smaps_rollup Rss, else
//     VmRSS) before dsopt_create and after the step (every buffer is
//     touched by then), as it is and after malloc_trim(0) (which returns
//     to the system the freed heap memory that glibc keeps, e.g. MPI's
//     temporary buffers of the step's collectives), its growth against
//     dsopt's accounting, the peak growth (VmHWM, reset through
//     /proc/self/clear_refs before dsopt_create) and what is left resident
//     after dsopt_destroy and malloc_trim(0). The caller's parameters and
//     gradients are allocated and touched before; MPI's connections are set
//     up by collectives of the step's sizes before the first measurement;
//     malloc_trim(0) runs before each baseline so that memory freed by the
//     previous optimizer is not reused unseen.
//
// Part 2, step time and bytes (--numel Psi, default 64M as in part 1; 0
// leaves it out), for fp32 and for bf16 parameters (gradients of the
// parameters' dtype, fixed, different on every rank, multiples of 1/1024 in
// [-1/16, 1/16], so that their sums over ranks are exact in fp32 in any
// order): a stage-0 and a ZeRO-2 optimizer on two copies of the same
// initial parameters, stepped alternately (--warmup rounds untimed, then
// --steps rounds timed), so that whatever else the machine does falls on
// both alike. Step time = dsopt_step of the slowest rank, after a
// barrier. Reported: median, min and max over the timed steps, the ratio
// stage 0 / ZeRO-2 of the medians, info.bytes_sent per rank per step and
// (rank 0, when /sys/class/net/lo exists) the loopback device's bytes per
// step divided by N, median over the timed steps, and its ratio to
// bytes_sent (TCP/IP headers included; exact only inside netem.sh's
// private namespace; 0 when the ranks talk through shared memory, as a
// plain `mpirun` on one machine does). bytes_sent counts what a ring or
// pairwise algorithm sends; the MPI library may choose others (Open MPI
// 4.1's default MPI_Reduce_scatter_block at 4 ranks goes through rank 0,
// which shows here as lo/sent above 1 for ZeRO-2).
// Also the cost of an all-or-nothing ZeRO step: after each timed ZeRO-2
// step every rank copies what such a step would have to set aside before
// its update (its shard of exp_avg, exp_avg_sq, the masters and the
// parameters) into scratch memory; reported: its size, the slowest rank's
// copy time (median, min, max) and its share of ZeRO-2's median step.
// Checked: bytes_sent equals the formula on every rank and step
//   stage 0: allreduce of Psi + 1 floats, 2 (N-1)/N * 4 (Psi + 1)
//   ZeRO-2:  reduce-scatter of every bucket (N-1)/N * 4 n' + allgather of
//            the shard (N-1) S w (w = 2 for bf16, 4 for fp32) + the
//            status/norm allreduce of 2 doubles 2 (N-1)/N * 16;
//   both:    + the handshake 2 (N-1)/N * 16, and in the first 3 steps one
//            more 16-byte allreduce (the ranks compare their gradients);
// every rank ends with the same parameters for each optimizer; and ZeRO-2's
// parameters equal stage 0's bit for bit (exact gradients: the averaged
// gradient is the same whatever order the two reductions sum in).
//
//   zero_e2e_bench [--mem-numel N] [--numel N] [--tensors T] [--bucket E]
//                  [--ag-bucket E] [--warmup W] [--steps S] [--threads T]
//                  [--fp32 0|1] [--bf16 0|1] [--stage1 0|1] [--lamb 0|1]
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <malloc.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpi_fail.hpp"
#include "zero_model.hpp"

namespace {

using namespace zero_model;

int g_rank = 0, g_world = 1;

constexpr double kMiB = 1024.0 * 1024.0;

[[noreturn]] void fail_all(const std::string& what) { bench::fail_all("zero_e2e_bench", g_rank, what); }

#define ZB_CHECK(call)                                                   \
  do {                                                                  \
    const std::string failure_ = bench::call_failure((call), #call);    \
    if (!failure_.empty()) fail_all(failure_);                          \
  } while (0)


// ---- the model ----------------------------------------------------------------

// The elements of LAMB's sum blocks (4,096 elements from each tensor's
// start) that no one bucket piece holds whole: C of the formula at the top.
int64_t lamb_cut_numel(const std::vector<int64_t>& sizes, const Layout& L, int P) {
  const auto piece = [&](int64_t x) {
    const int64_t k = x / L.bucket, len = std::min(L.bucket, L.padded - k * L.bucket);
    return k * P + (x - k * L.bucket) / (len / P);
  };
  int64_t start = 0, cut = 0;
  for (int64_t n : sizes) {
    for (int64_t b = 0; b < n; b += 4096) {
      const int64_t lo = start + b, hi = start + std::min(n, b + 4096);
      if (piece(lo) != piece(hi - 1)) cut += hi - lo;
    }
    start += n;
  }
  return cut;
}

Expected expected_stage0(int64_t n, int P, bool half, bool lamb) {
  Expected e;
  e.masters = half ? 4.0 * double(n) : 0.0;
  e.moments = 8.0 * double(n);
  if (P > 1) e.grads = 4.0 * double(n + 1);  // averaged gradients and the status float
  if (lamb) e.lamb = 4.0 * double(n);
  return e;
}

// ---- the parameters ---------------------------------------------------------

// ---- process memory ---------------------------------------------------------

// Resident bytes: smaps_rollup's Rss when there is one, else VmRSS.
long long rss_bytes() {
  for (const char* path : {"/proc/self/smaps_rollup", "/proc/self/status"}) {
    std::FILE* f = std::fopen(path, "r");
    if (!f) continue;
    char line[256];
    long long kb = -1;
    const char* key = std::strstr(path, "smaps_rollup") ? "Rss:" : "VmRSS:";
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, key, std::strlen(key)) == 0) {
        kb = std::atoll(line + std::strlen(key));
        break;
      }
    std::fclose(f);
    if (kb >= 0) return kb * 1024;
  }
  return -1;
}

const char* rss_source() {
  std::FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  if (f) {
    std::fclose(f);
    return "/proc/self/smaps_rollup Rss";
  }
  return "/proc/self/status VmRSS";
}

long long hwm_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::atoll(line + 6);
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false when refused.
bool reset_hwm() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

// ---- optimizers ---------------------------------------------------------------

struct Options {
  int64_t mem_numel, numel, bucket, ag_bucket;
  int tensors, warmup, steps, threads;
  bool fp32, bf16, stage1, lamb;
  const char* type() const { return lamb ? "Lamb" : "AdamW"; }
};

std::string config(const Options& o, int stage) {
  char c[512];
  char zero[256] = "";
  if (stage > 0)
    std::snprintf(zero, sizeof zero,
                  ", \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %lld,"
                  " \"allgather_bucket_size\": %lld}",
                  stage, static_cast<long long>(o.bucket), static_cast<long long>(o.ag_bucket));
  std::snprintf(c, sizeof c,
                "{\"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 1e-3, \"betas\": [0.9, 0.999],"
                " \"eps\": 1e-8, \"weight_decay\": 0.01}}, \"threads\": %d%s}",
                o.type(), o.threads, zero);
  return c;
}


// ---- part 1: memory -----------------------------------------------------------

struct MemRow {
  long long rss0, rss_create, rss_step, rss_step_trim, hwm, rss_destroy;
  uint64_t acc_create, acc_step;
};

MemRow measure_memory(const Options& o, int stage, const std::vector<int64_t>& sizes, Flat& p,
                      const Flat& init, const std::vector<dsopt_tensor>& pv,
                      const std::vector<dsopt_tensor>& gv, dsopt_comm* comm) {
  std::memcpy(p.bytes.get(), init.bytes.get(), p.size());
  (void)sizes;
  malloc_trim(0);
  MPI_Barrier(MPI_COMM_WORLD);
  MemRow m;
  const bool hwm_ok = reset_hwm();
  m.rss0 = rss_bytes();
  dsopt_optimizer* opt = nullptr;
  const std::string cfg = config(o, stage);
  ZB_CHECK(dsopt_create(&opt, cfg.c_str(), comm, pv.data(), int64_t(pv.size())));
  m.rss_create = rss_bytes();
  m.acc_create = host_usage(opt, fail_all);
  checked_step(opt, gv, fail_all);
  m.rss_step = rss_bytes();
  m.hwm = hwm_ok ? hwm_bytes() : -1;
  malloc_trim(0);
  m.rss_step_trim = rss_bytes();
  m.acc_step = host_usage(opt, fail_all);
  dsopt_destroy(opt);
  malloc_trim(0);
  m.rss_destroy = rss_bytes();
  MPI_Barrier(MPI_COMM_WORLD);
  return m;
}

void run_memory(const Options& o, dsopt_comm* comm) {
  const int P = g_world;
  const std::vector<int64_t> sizes = model_sizes(o.mem_numel, o.tensors, fail_all);
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  const Layout L(n, P, o.bucket, o.ag_bucket);
  const int64_t cut = o.lamb ? lamb_cut_numel(sizes, L, P) : 0;

  // The caller's buffers, touched before any measurement.
  Flat p(true, n), init(true, n), g(true, n);
  init.fill_params();
  g.fill_grads(g_rank);
  std::memcpy(p.bytes.get(), init.bytes.get(), p.size());
  const std::vector<dsopt_tensor> pv = p.views(sizes), gv = g.views(sizes);

  // MPI's lazily made connections and buffers: one of each collective the
  // steps make, at their sizes, before the first baseline.
  {
    std::vector<float> a(size_t(L.largest_bucket)), b(size_t(L.largest_bucket / P));
    MPI_Reduce_scatter_block(a.data(), b.data(), int(L.largest_bucket / P), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD);
    std::vector<uint16_t> s(size_t(L.ag_len)), r(size_t(L.ag_len) * size_t(P));
    MPI_Allgather(s.data(), int(L.ag_len), MPI_UINT16_T, r.data(), int(L.ag_len), MPI_UINT16_T,
                  MPI_COMM_WORLD);
    std::vector<float> big(size_t(n + 1));
    MPI_Allreduce(MPI_IN_PLACE, big.data(), int(n + 1), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }

  if (g_rank == 0) {
    std::printf("== memory per rank: bf16 parameters, Psi = %lld in %d tensors, %d ranks ==\n",
                static_cast<long long>(n), o.tensors, P);
    std::printf("layout: n' = %lld (Psi padded to a multiple of 2N = %d), S = n'/N = %lld;\n"
                "        reduce_bucket_size %lld -> B = %lld elements (%lld buckets, largest %lld);\n"
                "        allgather_bucket_size %lld -> L = min(S, %lld/N) = %lld elements per rank"
                " per chunk (%lld chunks), w = 2 B\n",
                static_cast<long long>(L.padded), 2 * P, static_cast<long long>(L.shard),
                static_cast<long long>(o.bucket), static_cast<long long>(L.bucket),
                static_cast<long long>(L.buckets), static_cast<long long>(L.largest_bucket),
                static_cast<long long>(o.ag_bucket), static_cast<long long>(o.ag_bucket),
                static_cast<long long>(L.ag_len), static_cast<long long>(L.ag_chunks));
    std::printf("process memory: %s; peak: VmHWM reset before dsopt_create\n\n", rss_source());
    std::fflush(stdout);
  }

  std::vector<int> stages = {0};
  if (o.stage1) stages.push_back(1);
  stages.push_back(2);
  struct Out {
    int stage;
    std::vector<MemRow> rows;
  };
  std::vector<Out> outs;
  for (int stage : stages) {
    const MemRow m = measure_memory(o, stage, sizes, p, init, pv, gv, comm);
    std::vector<MemRow> all(static_cast<size_t>(P));
    MPI_Gather(&m, int(sizeof m), MPI_BYTE, all.data(), int(sizeof m), MPI_BYTE, 0, MPI_COMM_WORLD);
    outs.push_back(Out{stage, all});
  }
  if (g_rank != 0) return;

  // "formula": the textbook 16 Psi (stage 0: masters 4, moments 8, averaged
  // gradients 4 per element) or 12 Psi/N + 4 Psi/N + the scratch buffer
  // (ZeRO); "exact": the same from the layout (padding, the status float).
  std::printf("%-7s %4s %10s %10s %10s %9s %10s %10s %9s %10s %10s\n", "config", "rank",
              "acc create", "acc step", "formula", "acc/form", "RSS grow", "RSS trim", "trim/acc",
              "peak grow", "left after");
  std::printf("%-7s %4s %10s %10s %10s %9s %10s %10s %9s %10s %10s\n", "", "", "MiB", "MiB", "MiB",
              "", "MiB", "MiB", "", "MiB", "destr. MiB");
  double worst_trim = 0.0, worst_raw = 0.0;
  for (const Out& out : outs) {
    for (int r = 0; r < P; ++r) {
      const MemRow& m = out.rows[size_t(r)];
      const Expected e = out.stage == 0 ? expected_stage0(n, P, true, o.lamb)
                                        : expected_zero(L, P, r, true, o.lamb, cut);
      const double formula = out.stage == 0 ? (P > 1 ? 16.0 : 12.0) * double(n) + e.lamb
                                            : 16.0 * double(n) / P + e.scratch() + e.lamb;
      const double raw = double(m.rss_step - m.rss0), trim = double(m.rss_step_trim - m.rss0);
      const double acc = double(m.acc_step);
      char name[16];
      std::snprintf(name, sizeof name, out.stage == 0 ? "stage 0" : "ZeRO-%d", out.stage);
      char peak[16] = "-";
      if (m.hwm >= 0) std::snprintf(peak, sizeof peak, "%.1f", double(m.hwm - m.rss0) / kMiB);
      std::printf("%-7s %4d %10.1f %10.1f %10.1f %9.5f %10.1f %10.1f %9.4f %10s %10.1f\n", name, r,
                  double(m.acc_create) / kMiB, acc / kMiB, formula / kMiB, acc / formula, raw / kMiB,
                  trim / kMiB, trim / acc, peak, double(m.rss_destroy - m.rss0) / kMiB);
      worst_trim = std::max(worst_trim, std::fabs(trim / acc - 1.0));
      worst_raw = std::max(worst_raw, std::fabs(raw / acc - 1.0));
      if (acc != e.total())
        std::printf("        ^ dsopt_memory_usage differs from the exact layout formula (%.0f B) by %+.0f"
                    " bytes\n", e.total(), acc - e.total());
    }
  }
  const Expected z = expected_zero(L, P, 0, true, o.lamb, cut), s0 = expected_stage0(n, P, true, o.lamb);
  std::printf("\nexact formula, rank 0 (MiB): stage 0: masters %.2f + moments %.2f + averaged grads"
              " %.2f + LAMB's u %.2f = %.2f;\n  ZeRO: masters %.2f + moments %.2f + gradient shard %.2f"
              " + scratch max(reduce bucket %.2f, allgather chunks %.2f) + LAMB's u and rebuilt"
              " blocks (C = %lld) %.2f = %.2f\n",
              s0.masters / kMiB, s0.moments / kMiB, s0.grads / kMiB, s0.lamb / kMiB, s0.total() / kMiB,
              z.masters / kMiB, z.moments / kMiB, z.grads / kMiB, z.reduce_buf / kMiB,
              z.ag_buf / kMiB, static_cast<long long>(cut), z.lamb / kMiB, z.total() / kMiB);
  std::printf("ZeRO-2 / stage 0 (accounted, after the step, rank 0): %.4f (%.2fx less)\n",
              double(outs.back().rows[0].acc_step) / double(outs.front().rows[0].acc_step),
              double(outs.front().rows[0].acc_step) / double(outs.back().rows[0].acc_step));
  std::printf("RSS growth across dsopt_create + dsopt_step vs dsopt's accounting, worst rank and\n"
              "config: %.2f%% after malloc_trim(0), %.2f%% as is (goal: within 5%%)\n\n",
              100.0 * worst_trim, 100.0 * worst_raw);
  std::fflush(stdout);
}

// ---- part 2: step time and bytes ---------------------------------------------

// Steps whose gradients dsopt compares across ranks (src/optim/replication_check.hpp).
constexpr int kReplicationChecked = 3;

struct Timing {
  std::vector<double> s;  // slowest rank's dsopt_step, per timed step
  std::vector<double> lo; // loopback bytes per step / N (rank 0), per timed step
  uint64_t bytes = 0;     // info.bytes_sent (same every step, checked)
  uint64_t acc = 0;       // dsopt_memory_usage host bytes
  static double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  double median() const { return median_of(s); }
  double lo_median() const { return lo.empty() ? -1.0 : median_of(lo); }
};

// What a ZeRO step would have to copy aside to be undone after a failed
// parameter allgather (its one collective after the update, see
// docs/robustness.md): this rank's shard of exp_avg, exp_avg_sq and the
// masters (state views), and of the parameters. copy() copies it into
// scratch memory of the same size, as such a snapshot would every step.
struct ShardSnapshot {
  std::vector<std::pair<const uint8_t*, size_t>> pieces;
  bench::Buffer<uint8_t> scratch;
  size_t bytes = 0;
  ShardSnapshot(dsopt_optimizer* opt, const std::vector<dsopt_tensor>& params) {
    for (int64_t i = 0; i < int64_t(params.size()); ++i) {
      const size_t w = params[size_t(i)].dtype == DSOPT_FLOAT32 ? 4 : 2;
      for (const char* name : {"exp_avg", "exp_avg_sq", "master"}) {
        dsopt_state_view v;
        v.struct_size = sizeof v;
        if (dsopt_get_state_view(opt, i, name, &v) != DSOPT_OK) continue;  // no master for fp32
        if (v.tensor.data == nullptr || v.tensor.numel == 0) continue;
        pieces.emplace_back(static_cast<const uint8_t*>(v.tensor.data), size_t(v.tensor.numel) * 4);
        if (std::string(name) == "exp_avg")  // the parameter's elements in the shard
          pieces.emplace_back(static_cast<const uint8_t*>(params[size_t(i)].data) + size_t(v.offset) * w,
                              size_t(v.tensor.numel) * w);
      }
    }
    for (const auto& p : pieces) bytes += p.second;
    scratch = bench::alloc_buffer<uint8_t>(int64_t(std::max<size_t>(bytes, 1)));
  }
  double copy() {
    const double t0 = bench::now_seconds();
    uint8_t* dst = scratch.get();
    for (const auto& p : pieces) {
      std::memcpy(dst, p.first, p.second);
      dst += p.second;
    }
    return bench::now_seconds() - t0;
  }
};

void run_timing(const Options& o, dsopt_comm* comm, bool half) {
  const int P = g_world;
  const std::vector<int64_t> sizes = model_sizes(o.numel, o.tensors, fail_all);
  int64_t n = 0;
  for (int64_t s : sizes) n += s;
  const Layout L(n, P, o.bucket, o.ag_bucket);
  const int64_t w = half ? 2 : 4;
  // Every step starts with the 16-byte handshake allreduce (the ranks agree
  // they are in the same dsopt call).
  const uint64_t handshake = uint64_t(2 * (P - 1)) * 16 / uint64_t(P);
  const uint64_t want0 = handshake + uint64_t(2 * (P - 1)) * uint64_t(n + 1) * 4 / uint64_t(P);
  uint64_t want2 = handshake + uint64_t(2 * (P - 1)) * 16 / uint64_t(P);
  for (int64_t k = 0, start = 0; k < L.buckets; ++k, start += L.bucket)
    want2 += uint64_t(P - 1) * uint64_t(std::min(L.bucket, L.padded - start) / P) * 4;
  for (int64_t c = 0; c < L.ag_chunks; ++c)
    want2 += uint64_t(P - 1) * uint64_t(std::min(L.ag_len, L.shard - c * L.ag_len)) * uint64_t(w);
  if (o.lamb) {  // the rebuilt blocks of p and u (when some are cut), then every block's two sums
    const uint64_t cut = uint64_t(lamb_cut_numel(sizes, L, P));
    uint64_t blocks = 0;
    for (int64_t x : sizes) blocks += uint64_t((x + 4095) / 4096);
    if (cut > 0) want2 += uint64_t(2 * (P - 1)) * (8 * cut) / uint64_t(P);
    want2 += uint64_t(2 * (P - 1)) * (16 * blocks) / uint64_t(P);
  }

  Flat p0(half, n), p2(half, n), g(half, n);
  p0.fill_params();
  std::memcpy(p2.bytes.get(), p0.bytes.get(), p0.size());
  g.fill_grads(g_rank);
  const std::vector<dsopt_tensor> v0 = p0.views(sizes), v2 = p2.views(sizes), gv = g.views(sizes);
  dsopt_optimizer *opt0 = nullptr, *opt2 = nullptr;
  const std::string c0 = config(o, 0), c2 = config(o, 2);
  ZB_CHECK(dsopt_create(&opt0, c0.c_str(), comm, v0.data(), int64_t(v0.size())));
  ZB_CHECK(dsopt_create(&opt2, c2.c_str(), comm, v2.data(), int64_t(v2.size())));

  Timing t[2];
  Timing snapshot;  // ShardSnapshot::copy of the slowest rank, after each timed ZeRO-2 step
  std::unique_ptr<ShardSnapshot> shard;
  dsopt_optimizer* opts[2] = {opt0, opt2};
  const uint64_t want[2] = {want0, want2};
  const char* names[2] = {"stage 0", "ZeRO-2"};
  for (int round = 0; round < o.warmup + o.steps; ++round) {
    for (int k = 0; k < 2; ++k) {
      MPI_Barrier(MPI_COMM_WORLD);
      const long long lo0 = g_rank == 0 ? bench::lo_tx_bytes() : -1;
      const double t0 = bench::now_seconds();
      const dsopt_step_info info = checked_step(opts[k], gv, fail_all);
      const double mine = bench::now_seconds() - t0;
      double slowest = 0.0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const long long lo1 = g_rank == 0 ? bench::lo_tx_bytes() : -1;
      // The first kReplicationChecked steps also compare the ranks'
      // gradients (info.grads_replicated): one more 16-byte allreduce.
      const uint64_t expected = want[k] + (round < kReplicationChecked ? handshake : 0);
      if (info.bytes_sent != expected || info.step != round + 1)
        fail_all(std::string(names[k]) + ": step " + std::to_string(round + 1) + " sent " +
                 std::to_string(info.bytes_sent) + " bytes (formula: " + std::to_string(expected) +
                 "), info.step " + std::to_string(info.step));
      if (round < o.warmup) continue;
      t[k].s.push_back(slowest);
      t[k].bytes = info.bytes_sent;
      if (lo0 >= 0 && lo1 >= lo0) t[k].lo.push_back(double(lo1 - lo0) / P);
      if (k == 1) {
        if (!shard) shard = std::make_unique<ShardSnapshot>(opt2, v2);
        const double copy = shard->copy();
        double slowest_copy = 0.0;
        MPI_Allreduce(&copy, &slowest_copy, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        snapshot.s.push_back(slowest_copy);
      }
    }
  }
  const size_t snapshot_bytes = shard ? shard->bytes : 0;
  shard.reset();
  t[0].acc = host_usage(opt0, fail_all);
  t[1].acc = host_usage(opt2, fail_all);

  // Same parameters on every rank, and ZeRO-2's equal to stage 0's.
  for (int k = 0; k < 2; ++k) same_on_every_rank(k == 0 ? p0 : p2, names[k], fail_all);
  int64_t differ = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = half ? p0.b16()[i] == p2.b16()[i]
                           : std::memcmp(&p0.f32()[i], &p2.f32()[i], 4) == 0;
    if (!same && differ++ == 0) first = i;
  }
  if (differ > 0)
    fail_all("ZeRO-2's parameters differ from stage 0's in " + std::to_string(differ) + " of " +
             std::to_string(n) + " elements (first: " + std::to_string(first) + ")");
  dsopt_destroy(opt0);
  dsopt_destroy(opt2);

  if (g_rank != 0) return;
  std::printf("== step time: %s parameters and gradients, Psi = %lld in %d tensors, %d ranks,"
              " %d warmup + %d timed steps each, alternating ==\n",
              half ? "bf16" : "fp32", static_cast<long long>(n), o.tensors, P, o.warmup, o.steps);
  std::printf("%-8s %9s %9s %9s %8s %13s %13s %13s %8s %10s\n", "config", "median s", "min s",
              "max s", "s0/Z2", "bytes_sent", "formula", "lo bytes/N", "lo/sent", "dsopt MiB");
  for (int k = 0; k < 2; ++k) {
    const Timing& x = t[k];
    char ratio[16] = "-", lo[24] = "-", lo_ratio[16] = "-";
    if (k == 1) std::snprintf(ratio, sizeof ratio, "%.2f", t[0].median() / t[1].median());
    if (x.lo_median() >= 0) std::snprintf(lo, sizeof lo, "%.0f", x.lo_median());
    if (x.lo_median() > 0)
      std::snprintf(lo_ratio, sizeof lo_ratio, "%.3f", x.lo_median() / double(x.bytes));
    std::printf("%-8s %9.3f %9.3f %9.3f %8s %13llu %13llu %13s %8s %10.1f\n", names[k], x.median(),
                *std::min_element(x.s.begin(), x.s.end()), *std::max_element(x.s.begin(), x.s.end()),
                ratio, static_cast<unsigned long long>(x.bytes), static_cast<unsigned long long>(want[k]),
                lo, lo_ratio, double(x.acc) / kMiB);
  }
  std::printf("undo snapshot of ZeRO-2 (shard of exp_avg, exp_avg_sq, masters and parameters, rank 0"
              " %.1f MiB;\n  what an all-or-nothing step would copy aside before its update): median"
              " %.4f s (min %.4f, max %.4f),\n  %.1f%% of ZeRO-2's median step; dsopt marks the optimizer"
              " failed instead\n",
              double(snapshot_bytes) / kMiB, snapshot.median(),
              *std::min_element(snapshot.s.begin(), snapshot.s.end()),
              *std::max_element(snapshot.s.begin(), snapshot.s.end()),
              100.0 * snapshot.median() / t[1].median());
  std::printf("checked: bytes_sent = formula on every rank and step; identical parameters on every"
              " rank;\n         ZeRO-2's parameters = stage 0's, bit for bit, after %d steps\n\n",
              o.warmup + o.steps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const char* usage =
      "zero_e2e_bench [--mem-numel N] [--numel N] [--tensors T] [--bucket E] [--ag-bucket E]"
      " [--warmup W] [--steps S] [--threads T] [--fp32 0|1] [--bf16 0|1] [--stage1 0|1]"
      " [--lamb 0|1]";
  bench::Flags flags(argc, argv);
  Options o;
  o.mem_numel = flags.get("--mem-numel", int64_t(64) << 20, 0, int64_t(1) << 34);
  o.numel = flags.get("--numel", int64_t(64) << 20, 0, int64_t(1) << 34);
  o.tensors = int(flags.get("--tensors", 36, 1, 100000));
  o.bucket = flags.get("--bucket", int64_t(1) << 22, 1, int64_t(1) << 40);
  o.ag_bucket = flags.get("--ag-bucket", int64_t(1) << 22, 1, int64_t(1) << 40);
  o.warmup = int(flags.get("--warmup", 2, 0, 1000000));
  o.steps = int(flags.get("--steps", 10, 1, 1000000));
  o.threads = int(flags.get("--threads", 1, 1, 256));
  o.fp32 = flags.get("--fp32", 1, 0, 1) != 0;
  o.bf16 = flags.get("--bf16", 1, 0, 1) != 0;
  o.stage1 = flags.get("--stage1", 1, 0, 1) != 0;
  o.lamb = flags.get("--lamb", 0, 0, 1) != 0;
  flags.finish(usage);
  omp_set_num_threads(o.threads);

  if (g_rank == 0) {
    std::printf("ZeRO stage 1/2 vs stage 0, %s, %d ranks\n", o.type(), g_world);
    std::printf("dsopt:   %s\n", dsopt_build_info());
    std::printf("machine: %s; %ld cores online, shared by the %d ranks; %d thread(s) per rank\n",
                bench::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), g_world, o.threads);
    std::printf("network: %s\n",
                bench::env_or("DSOPT_BENCH_NETWORK", "not described (set DSOPT_BENCH_NETWORK)"));
    std::printf("config:  %s\n", config(o, 2).c_str());
    const int64_t models[2] = {o.mem_numel, o.numel};
    for (int k = 0; k < 2; ++k) {
      if (models[k] == 0 || (k == 1 && models[1] == models[0])) continue;
      const std::vector<int64_t> sz = model_sizes(models[k], o.tensors, fail_all);
      int64_t total = 0;
      for (int64_t x : sz) total += x;
      std::printf("model:   Psi = %lld in %d tensors of odd sizes, %lld to %lld elements\n",
                  static_cast<long long>(total), o.tensors,
                  static_cast<long long>(*std::min_element(sz.begin(), sz.end())),
                  static_cast<long long>(*std::max_element(sz.begin(), sz.end())));
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  dsopt_comm* comm = nullptr;
  ZB_CHECK(dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)));
  if (o.mem_numel > 0) run_memory(o, comm);
  if (o.numel > 0) {
    if (o.fp32) run_timing(o, comm, false);
    if (o.bf16) run_timing(o, comm, true);
  }
  dsopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
