// Overlap of the gradient reduction with backward: dsopt_grad_ready during a
// simulated backward against dsopt_step with every gradient at once, through
// the public C API, on every rank of MPI_COMM_WORLD (initialised with
// MPI_THREAD_MULTIPLE, so that dsopt reduces on a thread of its own).
//
// The model: --layers L (16) layers, each a weight of H x H (--hidden H,
// 1024) and a bias of H elements, fp32 (bf16 with --dtype bf16), in parameter order w0, b0, w1, b1,
// ...: Psi = L (H^2 + H) elements (16,793,600 by default). Every optimizer
// is AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01),
// "threads" --threads (1), with "zero_optimization": {"stage": S,
// "reduce_bucket_size": --bucket (2^20)} for each stage of --stages (0 and
// 2), so that stage 0 packs its gradients into reduce buckets as well.
//
// The backward: layers L-1 down to 0, each first "computes" (a busy loop of
// fp32 arithmetic on 64 floats held in registers, K iterations, the same
// K on every rank; see busy()), then writes its gradients, bias then weight
// (deterministic values of the round, rank, parameter and element, 0.01 x
// uniform [-1, 1), not exact in fp32 sums), and then:
//   grad_ready  each gradient goes into ONE reusable buffer of H^2 floats
//               and is handed over at once with dsopt_grad_ready (reverse
//               parameter order, as autograd produces them); after layer 0,
//               dsopt_step(opt, NULL, 0, &info);
//   at once     each gradient goes into its own place of a buffer of Psi
//               floats; after layer 0, dsopt_step(opt, grads, 2L, &info).
// Two optimizers on two copies of the same initial parameters, one per
// mode, see the same gradients every round; the modes alternate within a
// round (grad_ready first in even rounds, at once first in odd ones), so that
// whatever else the machine does falls on both alike.
//
// Per step (from a barrier; each time the slowest rank's, MPI_MAX):
//   backward  the backward above, hand-overs included
//   total     backward + dsopt_step
//   exposed   total - backward: the communication (and update) not hidden
//             behind the backward
//   hand-over the time spent inside dsopt_grad_ready calls (grad_ready mode)
// reported as median (min - max) over --steps timed rounds after --warmup
// untimed ones, with the ratios grad_ready / at once of the medians of
// exposed and of total, and info.bytes_sent of each mode.
//
// The compute per layer: first --calib rounds with no busy loop measure the
// at-once dsopt_step with nothing else running (T_c, median of all but the
// first round: the reductions, the update and, at stage 2, the allgather)
// and the gradient writes alone (T_w, median of the at-once backward), and
// the update alone, which no overlap can hide (T_u: dsopt_step of a
// one-rank optimizer, MPI_COMM_SELF, over the elements this rank updates:
// Psi at stage 0, the shard Psi'/P at stage 2, every rank at once); the
// busy loop's speed is measured with every rank spinning at once (the way
// the backward runs; see busy_speed()). Each ratio f of --ratios (percent;
// default 50,100,200) then gives K so that the at-once backward takes about
// f x T_c:
// K = (f T_c - T_w) / L x speed (0 when f T_c < T_w). --layer-us X,Y,...
// instead gives a fixed busy loop of X microseconds per layer (at the
// calibrated speed) for each value.
//
// Checked after every setting: both modes' parameters are bit-identical on
// every rank (the header's promise for the same gradients), and every rank
// holds the same parameters; every step is applied (not skipped) and
// info.step counts every round.
//
// Deferred parameter allgather (--deferred 1, stage 1/2): the grad_ready
// optimizer has "deferred_allgather" (buckets of --gather-bucket elements,
// default --bucket), so its dsopt_step returns with the allgather in
// flight; a simulated forward pass then runs before each backward in both
// modes (layers 0 .. L-1, each a busy loop of --forward-pct percent of the
// backward's), and in grad_ready mode each layer first waits for its
// weight and bias (dsopt_gather_wait). "backward" is then forward +
// backward without those waits, and exposed = total - that: the waits
// count as exposed communication. The modes do not alternate then (the
// one's gathers would run during the other's step): each setting runs its
// at-once rounds, then its grad_ready rounds, on the same gradients.
//
//   overlap_e2e_bench [--layers L] [--hidden H] [--bucket E] [--stages S,S]
//                     [--ratios P,P,...] [--layer-us X,X,...] [--calib C]
//                     [--warmup W] [--steps N] [--threads T]
//                     [--thread-multiple 0|1] [--deferred 0|1]
//                     [--gather-bucket E] [--forward-pct F]
//                     [--dtype fp32|bf16] [--compression G/P]
// --dtype bf16: parameters and gradients in bf16 (dsopt keeps fp32 masters).
// --compression G/P (stage 1/2): compressed ZeRO, "compression":
// {"gradients": G, "parameters": P} (e.g. int4/int8), in both modes, whose
// allgather_bucket_size is then the same (--gather-bucket, else --bucket).
// --thread-multiple 0 initialises MPI with MPI_THREAD_SERIALIZED: dsopt then
// reduces each bucket inside the dsopt_grad_ready call that completes it
// (correct, no overlap), for comparison.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpi_fail.hpp"

namespace {

int g_rank = 0, g_world = 1;

[[noreturn]] void fail_all(const std::string& what) { bench::fail_all("overlap_e2e_bench", g_rank, what); }

#define OV_CHECK(call)                                                  \
  do {                                                                  \
    const std::string failure_ = bench::call_failure((call), #call);    \
    if (!failure_.empty()) fail_all(failure_);                          \
  } while (0)

struct Options {
  int layers = 16, warmup = 1, steps = 10, calib = 4, threads = 1;
  int64_t hidden = 1024, bucket = int64_t(1) << 20;
  bool thread_multiple = true;
  bool deferred = false;        // the grad_ready optimizer defers its allgather (stage 1/2)
  int64_t gather_bucket = 0;    // its allgather_bucket_size (0: --bucket)
  int64_t forward_pct = 0;      // forward busy loop, percent of the backward's (with --deferred: 50)
  std::vector<int64_t> stages{0, 2};
  std::vector<int64_t> ratios{50, 100, 200};  // percent of T_c
  std::vector<int64_t> layer_us;             // fixed busy loop per layer, if given
  int32_t dtype = DSOPT_FLOAT32;  // --dtype fp32 | bf16: parameters and gradients
  std::string codecs;             // --compression G/P: compressed ZeRO's codecs ("" off)
  size_t elem() const { return dtype == DSOPT_FLOAT32 ? 4 : 2; }
};

// ---- the model ----------------------------------------------------------------

struct Model {
  int layers;
  int64_t hidden, total = 0;
  std::vector<int64_t> sizes, offsets;  // per parameter: w_l at 2l, b_l at 2l+1
  Model(int L, int64_t H) : layers(L), hidden(H) {
    for (int l = 0; l < L; ++l)
      for (int64_t n : {H * H, H}) {
        offsets.push_back(total);
        sizes.push_back(n);
        total += n;
      }
  }
  int64_t params() const { return int64_t(sizes.size()); }
};

// Reduce buckets as dsopt cuts them. Stage 0 (src/handover/
// packed_allreduce.hpp): a packing of a status slot and the Psi gradients,
// Psi + 1 elements, cut into buckets of reduce_bucket_size, the last one
// shorter. Stage 1/2 (src/zero/shard_layout.hpp): Psi padded to a multiple
// of 2P, buckets of reduce_bucket_size rounded down to a multiple of 2P (at
// least 2P), the last one shorter.
struct Buckets {
  int64_t packed, bucket, count, last;
  Buckets(int stage, int64_t n, int P, int64_t bucket_elems) {
    if (stage == 0) {
      packed = n + 1;
      bucket = std::max<int64_t>(1, bucket_elems);
    } else {
      const int64_t align = 2 * int64_t(P);
      packed = (n + align - 1) / align * align;
      bucket = std::max(align, bucket_elems / align * align);
    }
    count = (packed + bucket - 1) / bucket;
    last = packed - (count - 1) * bucket;
  }
};

uint64_t grad_seed(int64_t round, int rank, int64_t param) {
  return ((uint64_t(round) * 1024 + uint64_t(rank)) << 16) + uint64_t(param) + 1;
}

// Element i of an array of `dtype` (fp32 or bf16, rounded to nearest even).
void store(void* base, int32_t dtype, int64_t i, float x) {
  if (dtype == DSOPT_FLOAT32)
    static_cast<float*>(base)[i] = x;
  else
    static_cast<uint16_t*>(base)[i] = bench::to_bf16_bits(x);
}
float load(const void* base, int32_t dtype, int64_t i) {
  return dtype == DSOPT_FLOAT32 ? static_cast<const float*>(base)[i]
                                : bench::from_bf16_bits(static_cast<const uint16_t*>(base)[i]);
}
void* at(void* base, int32_t dtype, int64_t i) {
  return static_cast<char*>(base) + i * (dtype == DSOPT_FLOAT32 ? 4 : 2);
}

// A gradient of the round: 0.01 x uniform [-1, 1), the same for both modes.
void write_grad(void* dst, int32_t dtype, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) store(dst, dtype, i, 0.01f * bench::hash_unit(seed, i));
}

// The layer's "compute": K rounds of the logistic map x <- r x (1 - x) on
// 64 floats held in registers (4 independent chains of 16; no memory
// traffic), r read from a volatile so that nothing is folded away; the
// result goes to a volatile sink. Time is linear in K.
volatile float g_logistic_r = 3.9f;
volatile float g_sink = 0.0f;
void busy(int64_t iters) {
  const float r = g_logistic_r;
  float a[64];
  for (int j = 0; j < 64; ++j) a[j] = 0.1f + 0.01f * float(j);
  for (int64_t k = 0; k < iters; ++k)
    for (int j = 0; j < 64; ++j) a[j] = r * a[j] * (1.0f - a[j]);
  float s = 0.0f;
  for (int j = 0; j < 64; ++j) s += a[j];
  g_sink = s;
}

double max_over_ranks(double x) {
  double y = 0.0;
  MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return y;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

uint64_t fingerprint(const void* p, int64_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (int64_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// The optimizers' config. With --compression, both optimizers of a stage
// get the same allgather_bucket_size: the int8 parameter codec's blocks
// follow the buckets, and the modes must hold the same values.
std::string config(const Options& o, int stage, bool deferred = false) {
  char c[900];
  char more[400] = "";
  const long long gather = o.gather_bucket > 0 ? o.gather_bucket : o.bucket;
  int used = 0;
  if (deferred) used = std::snprintf(more, sizeof more, ", \"deferred_allgather\": true");
  if (stage > 0 && (deferred || !o.codecs.empty()))
    used += std::snprintf(more + used, sizeof more - size_t(used), ", \"allgather_bucket_size\": %lld", gather);
  if (stage > 0 && !o.codecs.empty()) {
    const size_t slash = o.codecs.find('/');
    std::snprintf(more + used, sizeof more - size_t(used),
                  ", \"compression\": {\"gradients\": \"%s\", \"parameters\": \"%s\"}",
                  o.codecs.substr(0, slash).c_str(), o.codecs.substr(slash + 1).c_str());
  }
  std::snprintf(c, sizeof c,
                "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"betas\": [0.9, 0.999],"
                " \"eps\": 1e-8, \"weight_decay\": 0.01}}, \"threads\": %d,"
                " \"zero_optimization\": {\"stage\": %d, \"reduce_bucket_size\": %lld%s}}",
                o.threads, stage, static_cast<long long>(o.bucket), more);
  return c;
}

// ---- one step in each mode ------------------------------------------------------

struct StepTimes {
  double backward = 0, total = 0, handover = 0;  // seconds, slowest rank each
  double wait = 0;  // deferred: waiting for parameters in the forward (in total, not in backward)
  uint64_t bytes = 0;
};

struct Runner {
  const Model& m;
  int64_t round = 0;            // rounds so far: the gradients' seed, info.step
  const int32_t dtype;          // of parameters and gradients
  // (fp32-sized buffers, used as bf16 arrays with --dtype bf16)
  bench::Buffer<float> pa, pb;  // parameters of the grad_ready and the at-once optimizer
  bench::Buffer<float> one;     // grad_ready: the one reusable gradient buffer
  bench::Buffer<float> all;     // at once: every gradient
  std::vector<dsopt_tensor> grads;
  dsopt_optimizer *oa = nullptr, *ob = nullptr;
  bool deferred = false;       // oa defers its allgather (its own communicator)
  int64_t forward_iters = 0;   // busy loop per layer of the forward (0: none)
  int64_t forward_pct = 0;
  dsopt_comm* own = nullptr;   // oa's communicator when deferred

  Runner(const Model& model, const Options& o, int stage, dsopt_comm* comm)
      : m(model),
        dtype(o.dtype),
        pa(bench::alloc_buffer<float>(model.total)),
        pb(bench::alloc_buffer<float>(model.total)),
        one(bench::alloc_buffer<float>(model.hidden * model.hidden)),
        all(bench::alloc_buffer<float>(model.total)) {
    for (int64_t i = 0; i < m.total; ++i) store(pa.get(), dtype, i, 0.05f * bench::hash_unit(5001, i));
    std::memcpy(pb.get(), pa.get(), size_t(m.total) * 4);
    std::memset(one.get(), 0, size_t(m.hidden * m.hidden) * 4);
    std::memset(all.get(), 0, size_t(m.total) * 4);
    std::vector<dsopt_tensor> va, vb;
    for (int64_t j = 0; j < m.params(); ++j) {
      const int64_t off = m.offsets[size_t(j)], n = m.sizes[size_t(j)];
      va.push_back(dsopt_tensor{at(pa.get(), dtype, off), n, dtype, 0});
      vb.push_back(dsopt_tensor{at(pb.get(), dtype, off), n, dtype, 0});
      grads.push_back(dsopt_tensor{at(all.get(), dtype, off), n, dtype, 0});
    }
    const std::string cfg = config(o, stage);
    deferred = o.deferred && stage > 0;
    forward_pct = o.forward_pct;
    // The deferred gathers run on dsopt's thread while the other optimizer
    // may call collectives: a communicator (an MPI duplicate) of its own.
    if (deferred) OV_CHECK(dsopt_comm_create_mpi(&own, MPI_Comm_c2f(MPI_COMM_WORLD)));
    const std::string cfg_a = config(o, stage, deferred);
    OV_CHECK(dsopt_create(&oa, cfg_a.c_str(), deferred ? own : comm, va.data(), int64_t(va.size())));
    OV_CHECK(dsopt_create(&ob, cfg.c_str(), comm, vb.data(), int64_t(vb.size())));
  }
  ~Runner() {
    dsopt_destroy(oa);
    dsopt_destroy(ob);
    dsopt_comm_destroy(own);
  }

  // The forward: layers 0 .. L-1; `opt` waits for each layer's parameters
  // first (nullptr: no waits). Returns the seconds spent waiting.
  double forward(dsopt_optimizer* opt) {
    double wait = 0.0;
    for (int l = 0; l < m.layers; ++l) {
      if (opt) {
        const double w0 = bench::now_seconds();
        OV_CHECK(dsopt_gather_wait(opt, 2 * int64_t(l)));
        OV_CHECK(dsopt_gather_wait(opt, 2 * int64_t(l) + 1));
        wait += bench::now_seconds() - w0;
      }
      busy(forward_iters);
    }
    return wait;
  }

  static dsopt_step_info new_info() {
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    return info;
  }

  void check_info(const dsopt_step_info& info, const char* mode) const {
    if (info.skipped || info.step != round + 1)
      fail_all(std::string(mode) + ": round " + std::to_string(round + 1) + ": skipped " +
               std::to_string(info.skipped) + ", info.step " + std::to_string(info.step));
  }

  static StepTimes finish(double backward, double total, double handover, uint64_t bytes,
                          double wait = 0.0) {
    // the compute without the waits: the slowest rank's
    double mine[4] = {backward - wait, total, handover, wait}, worst[4];
    MPI_Allreduce(mine, worst, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    StepTimes t;
    t.backward = worst[0];
    t.total = worst[1];
    t.handover = worst[2];
    t.wait = worst[3];
    t.bytes = bytes;
    return t;
  }

  StepTimes grad_ready(int64_t iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench::now_seconds();
    double handover = 0.0;
    forward_iters = iters * forward_pct / 100;
    const double wait = forward_pct > 0 ? forward(deferred ? oa : nullptr) : 0.0;
    for (int l = m.layers - 1; l >= 0; --l) {
      busy(iters);
      for (int64_t j : {2 * int64_t(l) + 1, 2 * int64_t(l)}) {
        const int64_t n = m.sizes[size_t(j)];
        write_grad(one.get(), dtype, n, grad_seed(round, g_rank, j));
        const dsopt_tensor g{one.get(), n, dtype, 0};
        const double h0 = bench::now_seconds();
        OV_CHECK(dsopt_grad_ready(oa, j, &g));
        handover += bench::now_seconds() - h0;
      }
    }
    const double t1 = bench::now_seconds();
    dsopt_step_info info = new_info();
    OV_CHECK(dsopt_step(oa, nullptr, 0, &info));
    const double t2 = bench::now_seconds();
    check_info(info, "grad_ready");
    return finish(t1 - t0, t2 - t0, handover, info.bytes_sent, wait);
  }

  StepTimes at_once(int64_t iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench::now_seconds();
    forward_iters = iters * forward_pct / 100;
    if (forward_pct > 0) forward(nullptr);
    for (int l = m.layers - 1; l >= 0; --l) {
      busy(iters);
      for (int64_t j : {2 * int64_t(l) + 1, 2 * int64_t(l)})
        write_grad(at(all.get(), dtype, m.offsets[size_t(j)]), dtype, m.sizes[size_t(j)],
                   grad_seed(round, g_rank, j));
    }
    const double t1 = bench::now_seconds();
    dsopt_step_info info = new_info();
    OV_CHECK(dsopt_step(ob, grads.data(), int64_t(grads.size()), &info));
    const double t2 = bench::now_seconds();
    check_info(info, "at once");
    return finish(t1 - t0, t2 - t0, 0.0, info.bytes_sent);
  }

  // `rounds` rounds of each mode, at once first, then grad_ready (deferred
  // gathers overlap only grad_ready's own next forward); the same gradients
  // per round as run_round gives; out[i][0] grad_ready, out[i][1] at once.
  void run_series(int64_t iters, int rounds, std::vector<std::array<StepTimes, 2>>& out) {
    const int64_t start = round;
    out.assign(size_t(rounds), {});
    for (int i = 0; i < rounds; ++i) {
      round = start + i;
      out[size_t(i)][1] = at_once(iters);
    }
    for (int i = 0; i < rounds; ++i) {
      round = start + i;
      out[size_t(i)][0] = grad_ready(iters);
    }
    OV_CHECK(dsopt_gather_wait(oa, -1));
    round = start + rounds;
  }

  // One round: both modes, same gradients; out[0] grad_ready, out[1] at once.
  void run_round(int64_t iters, StepTimes out[2]) {
    if (round % 2 == 0) {
      out[0] = grad_ready(iters);
      if (deferred) OV_CHECK(dsopt_gather_wait(oa, -1));  // not during the other's step
      out[1] = at_once(iters);
    } else {
      out[1] = at_once(iters);
      out[0] = grad_ready(iters);
    }
    ++round;
  }

  // Both modes' parameters bit-identical on this rank, and every rank alike.
  void check_params(const std::string& where) const {
    OV_CHECK(dsopt_gather_wait(oa, -1));
    int64_t differ = 0, first = -1;
    const size_t es = dtype == DSOPT_FLOAT32 ? 4 : 2;
    for (int64_t i = 0; i < m.total; ++i)
      if (std::memcmp(at(pa.get(), dtype, i), at(pb.get(), dtype, i), es) != 0 && differ++ == 0) first = i;
    int64_t all_differ = 0;
    MPI_Allreduce(&differ, &all_differ, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (all_differ > 0) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "%s: grad_ready's parameters differ from at-once's in %lld elements on this"
                    " rank (%lld on all ranks), first at %lld: %.9g vs %.9g",
                    where.c_str(), static_cast<long long>(differ), static_cast<long long>(all_differ),
                    static_cast<long long>(first), first >= 0 ? double(load(pa.get(), dtype, first)) : 0.0,
                    first >= 0 ? double(load(pb.get(), dtype, first)) : 0.0);
      fail_all(msg);
    }
    const uint64_t h = fingerprint(pa.get(), m.total * int64_t(es));
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    if (lo != hi) fail_all(where + ": the ranks hold different parameters");
  }
};

// ---- reporting -------------------------------------------------------------------

struct Series {
  std::vector<double> backward, total, exposed, handover, wait;
  uint64_t bytes = 0;
  bool bytes_vary = false;
  void add(const StepTimes& t) {
    if (!total.empty() && t.bytes != bytes) bytes_vary = true;
    bytes = t.bytes;
    backward.push_back(t.backward);
    total.push_back(t.total);
    exposed.push_back(t.total - t.backward);
    handover.push_back(t.handover);
    wait.push_back(t.wait);
  }
};

std::string ms3(const std::vector<double>& v) {
  char s[64];
  std::snprintf(s, sizeof s, "%.0f (%.0f-%.0f)", 1e3 * median_of(v),
                1e3 * *std::min_element(v.begin(), v.end()), 1e3 * *std::max_element(v.begin(), v.end()));
  return s;
}

// Busy-loop iterations per second of one rank while every rank spins (as
// in the backward): a short pass to size the others, then 5 passes of about
// 0.5 s from a barrier; per pass the mean over ranks of iterations/seconds,
// and the median over the passes.
double busy_speed() {
  int64_t iters = 2000000;
  std::vector<double> speeds;
  for (int pass = 0; pass < 6; ++pass) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench::now_seconds();
    busy(iters);
    const double mine = double(iters) / (bench::now_seconds() - t0);
    double sum = 0.0;
    MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    const double speed = sum / g_world;
    if (pass > 0) speeds.push_back(speed);
    if (pass == 0) iters = std::max<int64_t>(iters, int64_t(0.5 * speed));
  }
  return median_of(speeds);
}

// T_u: the update alone, what no overlap can hide: dsopt_step of an AdamW
// optimizer on a one-rank communicator (MPI_COMM_SELF: no reduction) over
// the elements this rank updates (Psi at stage 0, the shard at stage 1/2),
// every rank at once; the slowest rank's, median of all but the first of
// `rounds`.
double update_alone(const Options& o, int64_t n, int rounds) {
  MPI_Comm self_dup;
  MPI_Comm_dup(MPI_COMM_SELF, &self_dup);
  dsopt_comm* self = nullptr;
  OV_CHECK(dsopt_comm_create_mpi(&self, MPI_Comm_c2f(self_dup)));
  bench::Buffer<float> p = bench::alloc_buffer<float>(n), g = bench::alloc_buffer<float>(n);
  for (int64_t i = 0; i < n; ++i) store(p.get(), o.dtype, i, 0.05f * bench::hash_unit(5001, i));
  const dsopt_tensor pv{p.get(), n, o.dtype, 0}, gv{g.get(), n, o.dtype, 0};
  dsopt_optimizer* opt = nullptr;
  const std::string cfg = config(o, 0);
  OV_CHECK(dsopt_create(&opt, cfg.c_str(), self, &pv, 1));
  std::vector<double> t;
  for (int i = 0; i < rounds; ++i) {
    write_grad(g.get(), o.dtype, n, grad_seed(i, g_rank, 0));
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench::now_seconds();
    OV_CHECK(dsopt_step(opt, &gv, 1, nullptr));
    const double dt = max_over_ranks(bench::now_seconds() - t0);
    if (i > 0 || rounds == 1) t.push_back(dt);
  }
  dsopt_destroy(opt);
  dsopt_comm_destroy(self);
  MPI_Comm_free(&self_dup);
  return median_of(t);
}

void run_stage(const Options& o, const Model& m, int stage, double speed, dsopt_comm* comm) {
  const int L = m.layers;
  const Buckets b(stage, m.total, g_world, o.bucket);
  const int64_t updated = stage == 0 ? m.total : b.packed / g_world;  // Psi, or the shard
  const double Tu = update_alone(o, updated, o.calib);
  Runner r(m, o, stage, comm);

  // Calibration: no busy loop; the first round also sets up MPI's connections.
  std::vector<double> tc, tw;
  for (int i = 0; i < o.calib; ++i) {
    StepTimes t[2];
    r.run_round(0, t);
    if (i == 0 && o.calib > 1) continue;
    tc.push_back(t[1].total - t[1].backward);
    tw.push_back(t[1].backward);
  }
  r.check_params("stage " + std::to_string(stage) + " calibration");
  const double Tc = median_of(tc), Tw = median_of(tw);

  struct Setting {
    std::string name;
    int64_t iters;
    Series s[2];
  };
  std::vector<Setting> settings;
  if (!o.layer_us.empty()) {
    for (int64_t us : o.layer_us) {
      char name[64];
      std::snprintf(name, sizeof name, "%lld us/layer", static_cast<long long>(us));
      settings.push_back(Setting{name, int64_t(double(us) * 1e-6 * speed), {}});
    }
  } else {
    for (int64_t pct : o.ratios) {
      const double per_layer = std::max(0.0, (double(pct) / 100.0 * Tc - Tw) / L);
      char name[64];
      std::snprintf(name, sizeof name, "%.2f x T_c", double(pct) / 100.0);
      settings.push_back(Setting{name, int64_t(per_layer * speed), {}});
    }
  }
  for (Setting& st : settings) {
    if (r.deferred) {
      std::vector<std::array<StepTimes, 2>> t;
      r.run_series(st.iters, o.warmup + o.steps, t);
      for (int i = o.warmup; i < o.warmup + o.steps; ++i) {
        st.s[0].add(t[size_t(i)][0]);
        st.s[1].add(t[size_t(i)][1]);
      }
    }
    for (int i = 0; !r.deferred && i < o.warmup + o.steps; ++i) {
      StepTimes t[2];
      r.run_round(st.iters, t);
      if (i < o.warmup) continue;
      st.s[0].add(t[0]);
      st.s[1].add(t[1]);
    }
    r.check_params("stage " + std::to_string(stage) + ", " + st.name);
    if (g_rank == 0) {
      std::printf(".");
      std::fflush(stdout);
    }
  }
  if (g_rank != 0) return;

  std::printf("\n== stage %d: %d ranks, Psi = %lld, reduce_bucket_size %lld -> %lld buckets of"
              " %lld elements, the last %lld\n   (%s %lld elements) ==\n",
              stage, g_world, static_cast<long long>(m.total), static_cast<long long>(o.bucket),
              static_cast<long long>(b.count), static_cast<long long>(b.bucket),
              static_cast<long long>(b.last),
              stage == 0 ? "allreduced in place in a packing of a status slot and the gradients,"
                         : "reduce-scattered from the gradients padded to a multiple of 2P,",
              static_cast<long long>(b.packed));
  std::printf("AdamW, %s parameters and gradients%s%s\n", o.dtype == DSOPT_FLOAT32 ? "fp32" : "bf16",
              stage > 0 && !o.codecs.empty() ? ", compressed ZeRO with codecs " : "",
              stage > 0 ? o.codecs.c_str() : "");
  std::printf("calibration (%d rounds, first left out): T_c = at-once dsopt_step with no backward"
              " running = %.0f ms;\n  T_u = the update alone (one-rank optimizer over the %lld"
              " elements this rank updates) = %.0f ms;\n  T_w = writing the gradients alone = %.0f ms"
              " per backward; busy loop %.0f iterations/ms per rank\n",
              o.calib, 1e3 * Tc, static_cast<long long>(updated),
              1e3 * Tu, 1e3 * Tw, speed * 1e-3);
  std::printf("%d warmup + %d timed rounds per setting; ms, median (min-max), slowest rank\n",
              o.warmup, o.steps);
  if (r.deferred)
    std::printf("grad_ready: deferred allgather (buckets of %lld elements), waited for layer by layer"
                " in a forward of %lld%% of the backward's busy loop (both modes run the forward;"
                " \"backward\" = forward + backward without the waits; at-once rounds first, then"
                " grad_ready's)\n",
                static_cast<long long>(o.gather_bucket > 0 ? o.gather_bucket : o.bucket),
                static_cast<long long>(o.forward_pct));
  else if (o.forward_pct > 0)
    std::printf("both modes run a forward of %lld%% of the backward's busy loop first (in"
                " \"backward\")\n", static_cast<long long>(o.forward_pct));
  std::printf("%-14s %10s %-11s %18s %18s %18s %16s %8s %8s %11s\n", "setting", "busy/layer",
              "mode", "backward", "total", "exposed", "hand-over", "exp a/b", "tot a/b", "bytes_sent");
  for (const Setting& st : settings) {
    for (int k = 0; k < 2; ++k) {
      const Series& s = st.s[k];
      char busy_ms[32] = "", ratio_e[16] = "", ratio_t[16] = "";
      if (k == 0) {
        std::snprintf(busy_ms, sizeof busy_ms, "%.1f ms", 1e3 * double(st.iters) / speed);
        std::snprintf(ratio_e, sizeof ratio_e, "%.2f",
                      median_of(st.s[0].exposed) / median_of(st.s[1].exposed));
        std::snprintf(ratio_t, sizeof ratio_t, "%.2f", median_of(st.s[0].total) / median_of(st.s[1].total));
      }
      std::printf("%-14s %10s %-11s %18s %18s %18s %16s %8s %8s %11llu%s\n",
                  k == 0 ? st.name.c_str() : "", busy_ms, k == 0 ? "grad_ready" : "at once",
                  ms3(s.backward).c_str(), ms3(s.total).c_str(), ms3(s.exposed).c_str(),
                  k == 0 ? ms3(s.handover).c_str() : "-", ratio_e, ratio_t,
                  static_cast<unsigned long long>(s.bytes), s.bytes_vary ? " (varies)" : "");
    }
  }
  for (const Setting& st : settings)
    if (r.deferred)
      std::printf("%-14s exposed / T_c: grad_ready %.2f, at once %.2f; grad_ready's wait in the"
                  " forward %s ms\n", st.name.c_str(), median_of(st.s[0].exposed) / Tc,
                  median_of(st.s[1].exposed) / Tc, ms3(st.s[0].wait).c_str());
  std::printf("checked: grad_ready's and at-once's parameters bit-identical on every rank after"
              " each setting\n         (%lld steps each), the same on every rank; no step skipped\n",
              static_cast<long long>(r.round));
  std::fflush(stdout);
}

// "--name a,b,c": non-negative integers; removed from args.
bool list_flag(std::vector<char*>& args, const char* name, std::vector<int64_t>& out) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (std::string(args[i]) != name) continue;
    if (i + 1 >= args.size()) fail_all(std::string(name) + " needs a value");
    std::vector<int64_t> v;
    const std::string text = args[i + 1];
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t comma = std::min(text.find(',', pos), text.size());
      const std::string item = text.substr(pos, comma - pos);
      char* end = nullptr;
      const long long x = std::strtoll(item.c_str(), &end, 10);
      if (item.empty() || *end || x < 0 || x > 100000000)
        fail_all(std::string("bad value for ") + name + ": '" + text + "'");
      v.push_back(x);
      pos = comma + 1;
    }
    out = v;
    args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
    return true;
  }
  return false;
}

// "--name value": the value, removed from args ("" when absent).
std::string string_flag(std::vector<char*>& args, const char* name) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (std::string(args[i]) != name) continue;
    if (i + 1 >= args.size()) fail_all(std::string(name) + " needs a value");
    const std::string value = args[i + 1];
    args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
    return value;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // MPI_THREAD_MULTIPLE unless --thread-multiple 0 (looked up before
  // MPI_Init_thread; checked again by the flag parser below).
  bool multiple = true;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--thread-multiple") multiple = std::string(argv[i + 1]) != "0";
  const int wanted = multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, wanted, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);

  Options o;
  std::vector<char*> args(argv, argv + argc);
  list_flag(args, "--stages", o.stages);
  list_flag(args, "--ratios", o.ratios);
  list_flag(args, "--layer-us", o.layer_us);
  const std::string dtype = string_flag(args, "--dtype");
  if (dtype == "bf16")
    o.dtype = DSOPT_BFLOAT16;
  else if (!dtype.empty() && dtype != "fp32")
    fail_all("--dtype takes fp32 or bf16, not '" + dtype + "'");
  o.codecs = string_flag(args, "--compression");
  if (!o.codecs.empty() && o.codecs.find('/') == std::string::npos)
    fail_all("--compression takes GRADIENTS/PARAMETERS codecs (e.g. int4/int8), not '" + o.codecs + "'");
  for (int64_t s : o.stages)
    if (s > 2) fail_all("--stages: 0, 1 or 2");
  const char* usage =
      "overlap_e2e_bench [--layers L] [--hidden H] [--bucket E] [--stages S,S] [--ratios P,P,...]"
      " [--layer-us X,X,...] [--calib C] [--warmup W] [--steps N] [--threads T] [--thread-multiple 0|1]"
      " [--deferred 0|1] [--gather-bucket E] [--forward-pct F]";
  bench::Flags flags(int(args.size()), args.data());
  o.layers = int(flags.get("--layers", o.layers, 1, 2048));
  o.hidden = flags.get("--hidden", o.hidden, 1, 1 << 16);
  o.bucket = flags.get("--bucket", o.bucket, 1, int64_t(1) << 40);
  o.calib = int(flags.get("--calib", o.calib, 1, 1000));
  o.warmup = int(flags.get("--warmup", o.warmup, 0, 1000000));
  o.steps = int(flags.get("--steps", o.steps, 1, 1000000));
  o.threads = int(flags.get("--threads", o.threads, 1, 256));
  o.thread_multiple = flags.get("--thread-multiple", 1, 0, 1) != 0;
  o.deferred = flags.get("--deferred", 0, 0, 1) != 0;
  o.gather_bucket = flags.get("--gather-bucket", 0, 0, int64_t(1) << 40);
  o.forward_pct = flags.get("--forward-pct", o.deferred ? 50 : 0, 0, 1000);
  flags.finish(usage);
  omp_set_num_threads(o.threads);
  const Model m(o.layers, o.hidden);

  if (g_rank == 0) {
    const char* level = provided == MPI_THREAD_MULTIPLE     ? "MPI_THREAD_MULTIPLE"
                        : provided == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                        : provided == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
                                                            : "MPI_THREAD_SINGLE";
    std::printf("Overlap of the gradient reduction with backward: dsopt_grad_ready vs dsopt_step at"
                " once, AdamW, %d ranks\n", g_world);
    std::printf("dsopt:   %s\n", dsopt_build_info());
    std::printf("machine: %s; %ld cores online, shared by the %d ranks; %d thread(s) per rank\n",
                bench::cpu_model().c_str(), sysconf(_SC_NPROCESSORS_ONLN), g_world, o.threads);
    std::printf("network: %s\n",
                bench::env_or("DSOPT_BENCH_NETWORK", "not described (set DSOPT_BENCH_NETWORK)"));
    std::printf("MPI:     %s provided (%s asked)%s\n", level,
                multiple ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED",
                provided == MPI_THREAD_MULTIPLE
                    ? ""
                    : ": dsopt reduces inside dsopt_grad_ready, without overlap");
    std::printf("config:  %s (stage per table)\n", config(o, 2).c_str());
    std::printf("model:   %d layers of a %lld x %lld weight and a %lld bias, %s: Psi = %lld"
                " elements in %lld tensors\n", o.layers, static_cast<long long>(o.hidden),
                static_cast<long long>(o.hidden), static_cast<long long>(o.hidden),
                o.dtype == DSOPT_FLOAT32 ? "fp32" : "bf16", static_cast<long long>(m.total),
                static_cast<long long>(m.params()));
    std::fflush(stdout);
  }
  if (provided < wanted) fail_all("MPI_Init_thread provided a lower thread level than asked");

  dsopt_comm* comm = nullptr;
  OV_CHECK(dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)));
  const double speed = busy_speed();
  for (int64_t stage : o.stages) run_stage(o, m, int(stage), speed, comm);
  dsopt_comm_destroy(comm);
  MPI_Finalize();
  return 0;
}
