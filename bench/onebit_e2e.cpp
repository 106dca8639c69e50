// Data-parallel training of a bandwidth-bound model with 1-bit Adam against
// Adam, through the public C API, on every rank of MPI_COMM_WORLD.
//
// The model (default): multi-output linear regression y = W x + b with x of
// --in 64 features and --out 131072 outputs (8.5M parameters in two fp32
// tensors), trained by mean squared error, loss = 1/(2 B K) sum (y - t)^2,
// to imitate a fixed random rank-64 linear "teacher" t = A2 A1 x + noise
// (uniform noise of sd --noise 0.5, so the loss cannot go below
// noise^2 / 2 = 0.125). With --hidden H > 0 the model is instead the 2-layer
// MLP y = W2 tanh(W1 x + b1) + b2 (four tensors) against the teacher
// A2 tanh(A1 x) + noise. Forward and backward are plain loops (OpenMP simd)
// costing O(parameters) per sample; every rank draws its own fresh batch of
// --batch samples each step (no sample is shared or reused), computes the
// mean gradient of its batch and calls dsopt_step, so the step moves far
// more bytes over the network than it computes.
//
// Both runs start from the same weights and see the same batches, with the
// same learning-rate schedule (linear warmup over --lr-warmup steps, then
// linear decay to zero at the last step) through dsopt_set_lr:
//   Adam        "Adam", lr --lr 1e-2, betas (0.9, --beta2 0.999), eps 1e-8,
//               no weight decay, bias correction (1-bit Adam's warmup is the
//               same update up to rounding: its eps is added by an fma)
//   1-bit Adam  "OneBitAdam", the same, freeze_step --freeze-step (default:
//               a fifth of --steps 150; DeepSpeed advises 15-25% of training)
// Step time = forward + backward + dsopt_step, the slowest rank's, after a
// barrier (batch generation is outside it, as with a prefetching loader).
// Reported: median step time of Adam (steps after the first 3) and of 1-bit
// Adam's warmup and compression stages (the first 3 steps of each left
// out), their compute and dsopt_step parts, bytes sent per step
// (info.bytes_sent), each run's total time in steps, the training loss (mean over
// ranks of the batch losses) every --print-every steps, the mean training
// loss of the last 10 steps and the loss on held-out data (512 samples per
// rank), also as excess over the noise floor. And what all-or-nothing
// compressed steps would cost: after each step whose update holds a
// compressed exchange, every rank copies what such a step would set aside
// before it (the momentum, and buffers of the worker and server errors'
// sizes) into scratch memory; its size, the slowest rank's copy time and
// its share of those steps' median are printed.
//
// Checked: every rank ends with bit-identical parameters (both optimizers),
// the two runs' losses agree up to the freeze (the same update: to 1e-5
// relative for Adam and 1-bit Adam, bit for bit for LAMB and 1-bit LAMB),
// 1-bit Adam reports compressed = 1 exactly from update freeze_step on, and
// bytes_sent matches the formulas of docs/benchmarks.md (fp32 ring allreduce of the
// gradients, or the compressed allreduce of every tensor; a few scalar
// allreduces of the step on top).
//
//   onebit_e2e_bench [--in D] [--hidden H] [--out K] [--batch B] [--steps S]
//                    [--freeze-step F] [--lr-warmup W] [--lr X] [--beta2 X]
//                    [--noise X] [--threads T] [--print-every N]
//                    [--adam 0|1] [--onebit 0|1] [--lamb 0|1] [--lamb-lr X]
//                    [--zoadam 0|1] [--var-freeze-step F] [--var-update-scaler K]
//                    [--local-step-scaler S] [--local-step-clipper H]
//
// --threads T sets "threads" in every config and OpenMP's thread count of
// the model's loops (default 1); --threads 0 leaves both at their defaults
// (no "threads" key: the library's choice), as a new user would.
//
// --zoadam 1 adds a run of 0/1 Adam ("ZeroOneAdam", the same lr, betas
// and eps), with var_freeze_step --var-freeze-step (default: 15% of the
// steps), var_update_scaler --var-update-scaler (1), local_step_scaler
// --local-step-scaler (2) and local_step_clipper --local-step-clipper (16).
// For it: the bytes of every step as its phase says (full: the fp32
// allreduce; 1-bit and sync: the compressed allreduce; local: only the
// step's status allreduce), the losses equal to Adam's (to 1e-5) up to its
// first 1-bit step, bit-identical parameters on every rank after its last sync,
// and the average bytes per step over the whole run against Adam's.
//
// --lamb 1: the compressed run is 1-bit LAMB ("OneBitLamb", lr --lamb-lr
// (default: --lr; LAMB's trust ratio scales each tensor's step to about
// lr * ||p|| / ||update||), the same betas, eps and freeze_step, default
// trust-ratio settings), and a third
// run, "LAMB", is 1-bit LAMB with freeze_step past the last step (LAMB
// without compression; its losses equal 1-bit LAMB's up to the freeze).
// Bytes of a compressed 1-bit LAMB step: one compressed allreduce of the
// fused buffer of every momentum (docs/optimizers/onebit-lamb.md "1-bit LAMB").
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "topology_flag.hpp"
#include "mpi_fail.hpp"

namespace {

using bench::Buffer;

int g_rank = 0, g_world = 1;

double kLr = 1e-2, kBeta2 = 0.999;
double kLambLr = 0.0;  // --lamb-lr; 0: kLr
constexpr double kBeta1 = 0.9, kEps = 1e-8;
constexpr int kTeacherHidden = 64;
double kNoise = 0.5;
constexpr int kEvalSamples = 512;
const float kSqrt3 = std::sqrt(3.0f);

[[noreturn]] void fail_all(const std::string& what) { bench::fail_all("onebit_e2e_bench", g_rank, what); }

// Losses of two runs that apply the same update: equal (exact), or equal up
// to the fp32 rounding of two formulations of it (1e-5 relative).
bool same_loss(double a, double b, bool exact) {
  return exact ? a == b : std::fabs(a - b) <= 1e-5 * std::fabs(a);
}

#define E2E_CHECK(call)                                                   \
  do {                                                                  \
    const std::string failure_ = bench::call_failure((call), #call);    \
    if (!failure_.empty()) fail_all(failure_);                          \
  } while (0)

// hidden > 0: the MLP (tensors W1, b1, W2, b2); hidden == 0: the linear
// model y = W1 x + b1 (tensors W1, b1).
struct Shape {
  int64_t in, hidden, out;
  bool linear() const { return hidden == 0; }
  int64_t w1() const { return linear() ? out * in : hidden * in; }
  int64_t b1n() const { return linear() ? out : hidden; }
  int64_t w2() const { return out * hidden; }
  int64_t b2n() const { return linear() ? 0 : out; }
  int64_t total() const { return w1() + b1n() + w2() + b2n(); }
  std::vector<int64_t> sizes() const {
    if (linear()) return {w1(), b1n()};
    return {w1(), b1n(), w2(), b2n()};
  }
};

// Parameters or gradients: the four tensors back to back in one buffer.
struct Tensors {
  Buffer<float> all;
  float *w1, *b1, *w2, *b2;
  Tensors(const Shape& s) : all(bench::alloc_buffer<float>(s.total())) {
    w1 = all.get();
    b1 = w1 + s.w1();
    w2 = b1 + s.b1n();
    b2 = w2 + s.w2();
  }
  std::vector<dsopt_tensor> views(const Shape& s) const {
    std::vector<dsopt_tensor> v;
    float* p = all.get();
    for (int64_t n : s.sizes()) {
      v.push_back(dsopt_tensor{p, n, DSOPT_FLOAT32, 0});
      p += n;
    }
    return v;
  }
};

// The data: batch `index` of stream `stream` (one stream per rank for
// training, others for evaluation). Inputs are uniform with unit variance;
// targets come from the teacher plus noise. The teacher is A2 tanh(A1 x)
// for the MLP and the rank-64 linear map A2 A1 x for the linear model.
struct Teacher {
  const Shape& s;
  std::vector<float> a1, a2;  // kTeacherHidden x in, out x kTeacherHidden
  explicit Teacher(const Shape& shape) : s(shape) {
    a1.resize(size_t(kTeacherHidden * s.in));
    a2.resize(size_t(s.out * kTeacherHidden));
    // Pre-activations of sd 2 for tanh, of sd 1 for the linear teacher.
    const float sc1 = kSqrt3 * (s.linear() ? 1.0f : 2.0f) / std::sqrt(float(s.in));
    const float sc2 = kSqrt3 / std::sqrt(float(kTeacherHidden));
    for (size_t i = 0; i < a1.size(); ++i) a1[i] = sc1 * bench::hash_unit(7001, int64_t(i));
    for (size_t i = 0; i < a2.size(); ++i) a2[i] = sc2 * bench::hash_unit(7002, int64_t(i));
  }
  void batch(uint64_t stream, int64_t index, int64_t B, float* x, float* t) const {
    const uint64_t seed = 1000003ull * stream + uint64_t(index) * 7919ull + 17;
    for (int64_t i = 0; i < B * s.in; ++i) x[i] = kSqrt3 * bench::hash_unit(seed, i);
    std::vector<float> h(kTeacherHidden);
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * s.in;
      for (int j = 0; j < kTeacherHidden; ++j) {
        const float* row = a1.data() + j * s.in;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < s.in; ++i) acc += row[i] * xb[i];
        h[size_t(j)] = s.linear() ? acc : std::tanh(acc);
      }
      const float* hv = h.data();
      const float noise = float(kNoise) * kSqrt3;
#pragma omp parallel for schedule(static)
      for (int64_t k = 0; k < s.out; ++k) {
        const float* row = a2.data() + k * kTeacherHidden;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int j = 0; j < kTeacherHidden; ++j) acc += row[j] * hv[j];
        t[b * s.out + k] = acc + noise * bench::hash_unit(seed + 1, b * s.out + k);
      }
    }
  }
};

void init_params(const Shape& s, Tensors& p) {
  const float sc1 = kSqrt3 / std::sqrt(float(s.in));
  const float sc2 = s.linear() ? 0.0f : kSqrt3 / std::sqrt(float(s.hidden));
  bench::parallel_fill(p.w1, s.w1(), [&](int64_t i) { return sc1 * bench::hash_unit(5001, i); });
  bench::parallel_fill(p.b1, s.b1n(), [](int64_t) { return 0.0f; });
  bench::parallel_fill(p.w2, s.w2(), [&](int64_t i) { return sc2 * bench::hash_unit(5002, i); });
  bench::parallel_fill(p.b2, s.b2n(), [](int64_t) { return 0.0f; });
}

// Activations of one batch.
struct Work {
  std::vector<float> x, t, h, y, dh;
  Work(const Shape& s, int64_t B)
      : x(size_t(B * s.in)),
        t(size_t(B * s.out)),
        h(size_t(B * s.hidden)),
        y(size_t(B * s.out)),
        dh(size_t(B * s.hidden)) {}
};

// The loss of outputs y against targets t: sum (y - t)^2 / (2 count).
double squared_error(const Work& w, int64_t count) {
  double loss = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double d = double(w.y[size_t(i)]) - double(w.t[size_t(i)]);
    loss += d * d;
  }
  return loss / double(2 * count);
}

// Forward pass; returns the batch's loss. Leaves h and y in w.
double forward(const Shape& s, const Tensors& p, int64_t B, Work& w) {
  const int64_t D = s.in, H = s.hidden, K = s.out;
  const float* x = w.x.data();
  float* h = w.h.data();
  float* y = w.y.data();
  if (s.linear()) {
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; ++k) {
      const float* row = p.w1 + k * D;
      for (int64_t b = 0; b < B; ++b) {
        const float* xb = x + b * D;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < D; ++i) acc += row[i] * xb[i];
        y[b * K + k] = acc + p.b1[k];
      }
    }
    return squared_error(w, B * K);
  }
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < H; ++j) {
    const float* row = p.w1 + j * D;
    for (int64_t b = 0; b < B; ++b) {
      const float* xb = x + b * D;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < D; ++i) acc += row[i] * xb[i];
      h[b * H + j] = std::tanh(acc + p.b1[j]);
    }
  }
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < K; ++k) {
    const float* row = p.w2 + k * H;
    for (int64_t b = 0; b < B; ++b) {
      const float* hb = h + b * H;
      float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
      for (int64_t j = 0; j < H; ++j) acc += row[j] * hb[j];
      y[b * K + k] = acc + p.b2[k];
    }
  }
  return squared_error(w, B * K);
}

// Backward pass after forward(): the mean gradient of the batch into g.
// y is overwritten by dloss/dy.
void backward(const Shape& s, const Tensors& p, int64_t B, Work& w, Tensors& g) {
  const int64_t D = s.in, H = s.hidden, K = s.out;
  float* dy = w.y.data();
  const float scale = 1.0f / float(B * K);
  for (int64_t i = 0; i < B * K; ++i) dy[i] = (dy[i] - w.t[size_t(i)]) * scale;
  const float* x = w.x.data();
  if (s.linear()) {  // gW[k, i] = sum_b dy[b, k] x[b, i]; gb[k] = sum_b dy[b, k]
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; ++k) {
      float* grow = g.w1 + k * D;
      float gb = 0.0f;
      for (int64_t i = 0; i < D; ++i) grow[i] = 0.0f;
      for (int64_t b = 0; b < B; ++b) {
        const float d = dy[b * K + k];
        gb += d;
        const float* xb = x + b * D;
#pragma omp simd
        for (int64_t i = 0; i < D; ++i) grow[i] += d * xb[i];
      }
      g.b1[k] = gb;
    }
    return;
  }
  for (int64_t k = 0; k < K; ++k) {
    float acc = 0.0f;
    for (int64_t b = 0; b < B; ++b) acc += dy[b * K + k];
    g.b2[k] = acc;
  }
  // Layer 2: gW2[k, j] = sum_b dy[b, k] h[b, j]; dh[b, j] = sum_k dy[b, k] W2[k, j]
  // (in blocks of j, so that dh stays in cache while W2 streams by).
  const float* h = w.h.data();
  float* dh = w.dh.data();
  constexpr int64_t kBlock = 512;
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < H; j0 += kBlock) {
    const int64_t j1 = std::min(H, j0 + kBlock);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = j0; j < j1; ++j) dh[b * H + j] = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const float* wrow = p.w2 + k * H;
      float* grow = g.w2 + k * H;
      for (int64_t j = j0; j < j1; ++j) grow[j] = 0.0f;
      for (int64_t b = 0; b < B; ++b) {
        const float d = dy[b * K + k];
        const float* hb = h + b * H;
        float* dhb = dh + b * H;
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) {
          grow[j] += d * hb[j];
          dhb[j] += d * wrow[j];
        }
      }
    }
    // Through tanh: dz = dh * (1 - h^2), kept in dh.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = j0; j < j1; ++j) dh[b * H + j] *= 1.0f - h[b * H + j] * h[b * H + j];
  }
  // Layer 1: gW1[j, i] = sum_b dz[b, j] x[b, i]; gb1[j] = sum_b dz[b, j].
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < H; ++j) {
    float* grow = g.w1 + j * D;
    float gb = 0.0f;
    for (int64_t i = 0; i < D; ++i) grow[i] = 0.0f;
    for (int64_t b = 0; b < B; ++b) {
      const float d = dh[b * H + j];
      gb += d;
      const float* xb = x + b * D;
#pragma omp simd
      for (int64_t i = 0; i < D; ++i) grow[i] += d * xb[i];
    }
    g.b1[j] = gb;
  }
}

double eval_loss(const Shape& s, const Teacher& teacher, const Tensors& p) {
  constexpr int64_t kChunk = 64;
  Work w(s, kChunk);
  double local = 0.0;
  for (int64_t c = 0; c < kEvalSamples / kChunk; ++c) {
    teacher.batch(1000 + uint64_t(g_rank), c, kChunk, w.x.data(), w.t.data());
    local += forward(s, p, kChunk, w);
  }
  local /= double(kEvalSamples / kChunk);
  double sum = 0.0;
  MPI_Allreduce(&local, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return sum / g_world;
}

uint64_t fingerprint(const float* p, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &p[i], 4);
    h = (h ^ u) * 1099511628211ull;
  }
  return h;
}

struct Options {
  Shape shape;
  int64_t batch;
  int steps, freeze_step, lr_warmup, threads, print_every;
  int var_freeze_step, var_update_scaler, local_step_scaler, local_step_clipper;
  bool step_log = false;  // --step-log 1: a "steplog:" line per step (rank 0)
  std::string hierarchy;  // --hierarchy: the "topology" key ("" leaves it out)
  long long ranks_per_node = 0;
  std::string node_reduce;  // --node-reduce fp32|1bit: its "node_reduce" for the 1-bit runs ("": left out)
};

enum class Algo { Adam, OneBitAdam, Lamb, OneBitLamb, ZeroOneAdam };

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::Adam: return "Adam";
    case Algo::OneBitAdam: return "1-bit Adam";
    case Algo::Lamb: return "LAMB";
    case Algo::OneBitLamb: return "1-bit LAMB";
    case Algo::ZeroOneAdam: return "0/1 Adam";
  }
  return "?";
}

// What a 1-bit step would have to copy aside to be undone after a failed
// compressed exchange (docs/robustness.md): the momentum (exp_avg, read
// through the state views), the worker error (as large) and the server
// error (1/N of it). The errors are not viewable: two scratch buffers of
// their sizes stand in for them, copied as they would be.
struct UndoSnapshot {
  std::vector<std::pair<const float*, int64_t>> momentum;
  std::vector<float> errors, errors_copy, momentum_copy;
  UndoSnapshot(dsopt_optimizer* opt, int64_t count, int64_t total) {
    for (int64_t i = 0; i < count; ++i) {
      dsopt_state_view v;
      v.struct_size = sizeof v;
      if (dsopt_get_state_view(opt, i, "exp_avg", &v) == DSOPT_OK && v.tensor.data)
        momentum.emplace_back(static_cast<const float*>(v.tensor.data), v.tensor.numel);
    }
    errors.assign(size_t(total + total / g_world), 1.0f);
    errors_copy.resize(errors.size());
    momentum_copy.resize(size_t(total));
  }
  uint64_t bytes() const { return 4 * uint64_t(errors.size() + momentum_copy.size()); }
  double copy() {
    const double t0 = bench::now_seconds();
    float* dst = momentum_copy.data();
    for (const auto& m : momentum) {
      std::memcpy(dst, m.first, size_t(m.second) * 4);
      dst += m.second;
    }
    std::memcpy(errors_copy.data(), errors.data(), errors.size() * 4);
    return bench::now_seconds() - t0;
  }
};

struct RunResult {
  std::string name;
  bool onebit = false;  // compressed after freeze_step
  bool lamb = false;
  bool zoadam = false;
  std::vector<int> phase;           // per step, info.phase
  uint64_t synced_fingerprint = 0;  // 0/1 Adam: parameters after its last sync
  int last_sync = -1;
  std::vector<double> loss;                      // per step, mean over ranks
  std::vector<double> step_s, compute_s, opt_s;  // per step, slowest rank
  std::vector<double> undo_s;  // UndoSnapshot::copy after each compressed step, slowest rank
  uint64_t undo_bytes = 0;
  std::vector<int> compressed;                   // per step, info.compressed
  std::vector<uint64_t> bytes;                   // per step, this rank's info.bytes_sent
  double step_total_s = 0;                       // sum of step_s
  double eval_initial = 0, eval_final = 0;

  double last10() const {
    double sum = 0.0;
    for (size_t i = loss.size() - 10; i < loss.size(); ++i) sum += loss[i];
    return sum / 10.0;
  }
};

double median_of(const std::vector<double>& v, size_t from, const std::vector<int>* only = nullptr,
                 int want = 0) {
  bench::Samples s;
  for (size_t i = from; i < v.size(); ++i)
    if (!only || (*only)[i] == want) s.seconds.push_back(v[i]);
  return s.seconds.empty() ? NAN : s.median();
}

// The learning-rate schedule: linear warmup over --lr-warmup steps, then
// linear decay, reaching zero one step after the last.
double lr_at(const Options& o, int step, double peak) {
  const double t = double(step + 1);
  if (t <= o.lr_warmup) return peak * t / o.lr_warmup;
  return peak * (double(o.steps) - t + 1) / (double(o.steps) - o.lr_warmup + 1);
}

RunResult train(const Options& o, const Teacher& teacher, Algo algo) {
  const Shape& s = o.shape;
  RunResult r;
  r.name = algo_name(algo);
  r.onebit = algo == Algo::OneBitAdam || algo == Algo::OneBitLamb;
  r.lamb = algo == Algo::Lamb || algo == Algo::OneBitLamb;
  r.zoadam = algo == Algo::ZeroOneAdam;
  const double peak = r.lamb && kLambLr > 0.0 ? kLambLr : kLr;
  Tensors p(s), g(s);
  init_params(s, p);
  const std::vector<dsopt_tensor> pv = p.views(s), gv = g.views(s);

  // --threads 0: no "threads" key (the library's default).
  char threads_key[32] = "";
  if (o.threads > 0) std::snprintf(threads_key, sizeof threads_key, ", \"threads\": %d", o.threads);
  char config[512];
  if (r.lamb)
    std::snprintf(config, sizeof config,
                  "{\"optimizer\": {\"type\": \"OneBitLamb\", \"params\": {\"lr\": %g, \"betas\":"
                  " [%g, %g], \"eps\": %g, \"freeze_step\": %d}}%s}",
                  peak, kBeta1, kBeta2, kEps, r.onebit ? o.freeze_step : o.steps + 1, threads_key);
  else if (r.zoadam)
    std::snprintf(config, sizeof config,
                  "{\"optimizer\": {\"type\": \"ZeroOneAdam\", \"params\": {\"lr\": %g, \"betas\":"
                  " [%g, %g], \"eps\": %g, \"var_freeze_step\": %d, \"var_update_scaler\": %d,"
                  " \"local_step_scaler\": %d, \"local_step_clipper\": %d}}%s}",
                  kLr, kBeta1, kBeta2, kEps, o.var_freeze_step, o.var_update_scaler,
                  o.local_step_scaler, o.local_step_clipper, threads_key);
  else if (r.onebit)
    std::snprintf(config, sizeof config,
                  "{\"optimizer\": {\"type\": \"OneBitAdam\", \"params\": {\"lr\": %g, \"betas\":"
                  " [%g, %g], \"eps\": %g, \"freeze_step\": %d}}%s}",
                  kLr, kBeta1, kBeta2, kEps, o.freeze_step, threads_key);
  else
    std::snprintf(config, sizeof config,
                  "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": %g, \"betas\":"
                  " [%g, %g], \"eps\": %g}}%s}",
                  kLr, kBeta1, kBeta2, kEps, threads_key);
  dsopt_comm* comm = nullptr;
  dsopt_optimizer* opt = nullptr;
  E2E_CHECK(dsopt_comm_create_mpi(&comm, MPI_Comm_c2f(MPI_COMM_WORLD)));
  const std::string full_config =
      bench::with_topology(config, o.hierarchy, o.ranks_per_node, algo == Algo::Adam || algo == Algo::Lamb ? "" : o.node_reduce);
  E2E_CHECK(dsopt_create(&opt, full_config.c_str(), comm, pv.data(), int64_t(pv.size())));
  if (o.threads == 0) {
    int32_t chosen = 0;
    E2E_CHECK(dsopt_get_threads(opt, &chosen));
    if (g_rank == 0) std::printf("%s: default config, dsopt_get_threads = %d\n", r.name.c_str(), int(chosen));
  }

  r.eval_initial = eval_loss(s, teacher, p);
  Work w(s, o.batch);
  std::unique_ptr<UndoSnapshot> undo;
  for (int step = 0; step < o.steps; ++step) {
    teacher.batch(uint64_t(g_rank), step, o.batch, w.x.data(), w.t.data());
    E2E_CHECK(dsopt_set_lr(opt, lr_at(o, step, peak)));
    const long long wire0 = o.step_log && g_rank == 0 ? bench::tc_cross_bytes() : -1;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = bench::now_seconds();
    const double loss = forward(s, p, o.batch, w);
    backward(s, p, o.batch, w, g);
    const double t1 = bench::now_seconds();
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    E2E_CHECK(dsopt_step(opt, gv.data(), int64_t(gv.size()), &info));
    const double t2 = bench::now_seconds();
    if (info.skipped || info.step != step + 1) fail_all(r.name + ": unexpected dsopt_step_info");

    double mine[3] = {t2 - t0, t1 - t0, t2 - t1}, slowest[3];
    MPI_Allreduce(mine, slowest, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double loss_sum = 0.0;
    MPI_Allreduce(&loss, &loss_sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    r.step_s.push_back(slowest[0]);
    r.compute_s.push_back(slowest[1]);
    r.opt_s.push_back(slowest[2]);
    r.loss.push_back(loss_sum / g_world);
    r.compressed.push_back(info.compressed);
    r.bytes.push_back(info.bytes_sent);
    r.phase.push_back(info.phase);
    if (o.step_log && g_rank == 0) {
      // One line per step for scripts: the run, the step, its phase, step
      // and dsopt_step seconds (slowest rank), info.bytes_sent, the bytes
      // across node boundaries (info.bytes_inter_node, or -1) and those the
      // emulated link counted (bench/netem_two_nodes.sh, or -1).
      const long long wire = wire0 < 0 ? -1 : bench::tc_cross_bytes() - wire0;
      std::printf("steplog: %s %d %d %.5f %.5f %llu %lld %lld\n", r.name.c_str(), step + 1, int(info.phase),
                  slowest[0], slowest[2], static_cast<unsigned long long>(info.bytes_sent),
                  bench::inter_node_bytes(info), wire);
    }
    if (info.phase == DSOPT_PHASE_COMPRESSED || info.phase == DSOPT_PHASE_SYNC) {
      if (!undo) undo = std::make_unique<UndoSnapshot>(opt, int64_t(pv.size()), s.total());
      const double copy = undo->copy();
      double slowest_copy = 0.0;
      MPI_Allreduce(&copy, &slowest_copy, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      r.undo_s.push_back(slowest_copy);
      r.undo_bytes = undo->bytes();
    }
    if (info.phase == DSOPT_PHASE_SYNC) {
      r.synced_fingerprint = fingerprint(p.all.get(), s.total());
      r.last_sync = step;
    }
    if (g_rank == 0 && o.print_every > 0 && (step + 1) % o.print_every == 0) {
      std::printf("  %-10s step %4d  loss %.5f  step %.3f s (compute %.3f, dsopt_step %.3f)%s\n",
                  r.name.c_str(), step + 1, r.loss.back(), slowest[0], slowest[1], slowest[2],
                  info.compressed ? "  compressed" : "");
      std::fflush(stdout);
    }
  }
  for (double t : r.step_s) r.step_total_s += t;
  r.eval_final = eval_loss(s, teacher, p);

  // Every rank must hold the same parameters (0/1 Adam: after its last
  // sync; its local steps leave them apart by design).
  const uint64_t h = r.zoadam ? r.synced_fingerprint : fingerprint(p.all.get(), s.total());
  uint64_t hmin = 0, hmax = 0;
  MPI_Allreduce(&h, &hmin, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hmax, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (hmin != hmax) fail_all(r.name + ": ranks ended with different parameters");

  dsopt_destroy(opt);
  dsopt_comm_destroy(comm);
  return r;
}

// Bytes a compression-stage step sends for the momentum: the compressed
// allreduce of every tensor (1-bit Adam) or of one fused buffer of all of
// them (1-bit LAMB), padded by DeepSpeed's rule (docs/optimizers/onebit-lamb.md).
double car_bytes(const Shape& s, int P, bool fused) {
  const int64_t divider = 8 * P / std::gcd(int64_t(P), int64_t(8));
  const int64_t unit = int64_t(P) * divider;
  std::vector<int64_t> sizes = s.sizes();
  if (fused) sizes = {s.total()};
  double total = 0.0;
  for (int64_t n : sizes) {
    const int64_t padded = n % unit == 0 ? n : n + unit - n % unit;
    total += double(P - 1) / P * double(padded) / 4.0 + 8.0 * (P - 1);
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);

  // --lr, --beta2 and --noise take real numbers; bench::Flags only
  // integers, so they go first.
  std::vector<char*> args(argv, argv + argc);
  auto real_flag = [&](const char* name, double& value, double lo, double hi) {
    for (size_t i = 1; i + 1 < args.size(); ++i) {
      if (std::string(args[i]) != name) continue;
      char* end = nullptr;
      value = std::strtod(args[i + 1], &end);
      if (*end || !(value >= lo && value < hi))
        fail_all(std::string("bad value for ") + name + ": '" + args[i + 1] + "'");
      args.erase(args.begin() + long(i), args.begin() + long(i) + 2);
      return;
    }
  };
  real_flag("--lr", kLr, 1e-12, 1.0);
  real_flag("--beta2", kBeta2, 0.0, 1.0);
  real_flag("--noise", kNoise, 0.0, 1e6);
  real_flag("--lamb-lr", kLambLr, 1e-12, 1.0);
  const char* usage =
      "onebit_e2e_bench [--in D] [--hidden H] [--out K] [--batch B] [--steps S] [--freeze-step F]"
      " [--lr-warmup W] [--lr X] [--beta2 X] [--noise X] [--threads T] [--print-every N]"
      " [--step-log 0|1] [--hierarchy auto|flat|node_aware] [--ranks-per-node R] [--node-reduce fp32|1bit]"
      " [--adam 0|1] [--onebit 0|1] [--lamb 0|1] [--lamb-lr X] [--zoadam 0|1] [--var-freeze-step F]"
      " [--var-update-scaler K] [--local-step-scaler S] [--local-step-clipper H]";
  bench::Flags flags(int(args.size()), args.data());
  Options o;
  o.shape.in = flags.get("--in", 64, 1, 1 << 20);
  o.shape.hidden = flags.get("--hidden", 0, 0, 1 << 24);
  o.shape.out = flags.get("--out", 131072, 1, 1 << 24);
  o.batch = flags.get("--batch", 16, 1, 1 << 16);
  o.steps = int(flags.get("--steps", 150, 12, 1000000));
  o.freeze_step = int(flags.get("--freeze-step", o.steps / 5, 2, 1000000));
  o.lr_warmup = int(flags.get("--lr-warmup", o.steps / 10, 1, 1000000));
  o.threads = int(flags.get("--threads", 1, 0, 256));
  o.print_every = int(flags.get("--print-every", 10, 0, 1000000));
  o.step_log = flags.get("--step-log", 0, 0, 1) != 0;
  o.hierarchy = flags.text("--hierarchy", "");
  o.ranks_per_node = flags.get("--ranks-per-node", 0, 0, 1 << 20);
  o.node_reduce = flags.text("--node-reduce", "");
  const bool run_adam = flags.get("--adam", 1, 0, 1) != 0;
  const bool run_onebit = flags.get("--onebit", 1, 0, 1) != 0;
  const bool lamb = flags.get("--lamb", 0, 0, 1) != 0;
  const bool run_zoadam = flags.get("--zoadam", 0, 0, 1) != 0;
  o.var_freeze_step = int(flags.get("--var-freeze-step", o.steps * 15 / 100, 1, 1000000));
  o.var_update_scaler = int(flags.get("--var-update-scaler", 1, 1, 1000000));
  o.local_step_scaler = int(flags.get("--local-step-scaler", 2, 1, 1000000));
  o.local_step_clipper = int(flags.get("--local-step-clipper", 16, 1, 1000000));
  flags.finish(usage);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  if (o.freeze_step + 4 > o.steps) fail_all("--freeze-step must be at least 4 below --steps");
  if (o.lr_warmup >= o.steps) fail_all("--lr-warmup must be below --steps");

  const Shape& s = o.shape;
  const Teacher teacher(s);
  const int P = g_world;
  const double floor = 0.5 * kNoise * kNoise;
  if (g_rank == 0) {
    std::printf("data-parallel training, %s%s vs Adam, %d ranks\n",
                run_onebit ? (lamb ? "1-bit LAMB and LAMB" : "1-bit Adam") : "",
                run_zoadam ? (run_onebit ? " and 0/1 Adam" : "0/1 Adam") : "", P);
    std::printf("dsopt:   %s\n", dsopt_build_info());
    if (o.threads > 0)
      std::printf("machine: %s; %d thread(s) per rank (\"threads\": %d)\n", bench::cpu_model().c_str(),
                  o.threads, o.threads);
    else
      std::printf("machine: %s; default config (no \"threads\"; OpenMP default of %d thread(s) per\n"
                  "         rank for the model's loops)\n",
                  bench::cpu_model().c_str(), omp_get_max_threads());
    std::printf("network: %s\n",
                bench::env_or("DSOPT_BENCH_NETWORK", "not described (set DSOPT_BENCH_NETWORK)"));
    if (s.linear())
      std::printf(
          "model:   linear regression %lld -> %lld, %lld parameters in 2 fp32 tensors; MSE\n"
          "         to a rank-64 linear teacher plus noise of sd %g (loss floor %.4f)\n",
          static_cast<long long>(s.in), static_cast<long long>(s.out),
          static_cast<long long>(s.total()), kNoise, floor);
    else
      std::printf(
          "model:   MLP %lld -> %lld (tanh) -> %lld, %lld parameters in 4 fp32 tensors; MSE\n"
          "         to a 64-hidden tanh teacher plus noise of sd %g (loss floor %.4f)\n",
          static_cast<long long>(s.in), static_cast<long long>(s.hidden),
          static_cast<long long>(s.out), static_cast<long long>(s.total()), kNoise, floor);
    std::printf(
        "train:   batch %lld per rank (fresh samples every step), %d steps; lr %g with\n"
        "         linear warmup over %d steps and linear decay to 0; betas (%g, %g),\n"
        "         eps %g, no bias correction; %s freeze_step %d%s\n\n",
        static_cast<long long>(o.batch), o.steps, kLr, o.lr_warmup, kBeta1, kBeta2, kEps,
        lamb ? "1-bit LAMB" : "1-bit Adam", o.freeze_step,
        lamb ? ("; (1-bit) LAMB lr " + std::to_string(kLambLr > 0 ? kLambLr : kLr)).c_str() : "");
    if (run_zoadam)
      std::printf("         0/1 Adam var_freeze_step %d, var_update_scaler %d, local_step_scaler %d,\n"
                  "         local_step_clipper %d\n\n",
                  o.var_freeze_step, o.var_update_scaler, o.local_step_scaler, o.local_step_clipper);
    std::fflush(stdout);
  }

  std::vector<RunResult> runs;
  if (run_adam) runs.push_back(train(o, teacher, Algo::Adam));
  if (lamb) runs.push_back(train(o, teacher, Algo::Lamb));
  if (run_onebit) runs.push_back(train(o, teacher, lamb ? Algo::OneBitLamb : Algo::OneBitAdam));
  // 0/1 Adam is kept apart: the comparisons below pair the last of `runs`
  // with the others.
  RunResult zo;
  if (run_zoadam) zo = train(o, teacher, Algo::ZeroOneAdam);

  // The stage switch, the bytes, and the common start of the two runs.
  // The bytes are the flat form's formulas; the node-aware form's are
  // checked by the library's tests (tests/python/test_node_aware_onebit.py).
  const bool flat = o.hierarchy.empty() || o.hierarchy == "flat";
  const double fp32_bytes = 2.0 * (P - 1) / P * 4.0 * double(s.total());
  for (const RunResult& r : runs) {
    const double onebit_bytes = car_bytes(s, P, r.lamb);
    for (int i = 0; i < o.steps; ++i) {
      const bool want_compressed = r.onebit && i + 1 >= o.freeze_step;
      if (r.compressed[size_t(i)] != int(want_compressed))
        fail_all(r.name + ": update " + std::to_string(i + 1) +
                 " reports compressed = " + std::to_string(r.compressed[size_t(i)]));
      const double expect = want_compressed ? onebit_bytes : fp32_bytes;
      const double got = double(r.bytes[size_t(i)]);
      if (flat && (got < expect || got > expect + 64.0 * P))
        fail_all(r.name + ": update " + std::to_string(i + 1) + " sent " + std::to_string(got) +
                 " bytes, expected " + std::to_string(expect) + " (+ a few scalars)");
    }
  }
  if (run_zoadam) {
    const double status_bytes = 2.0 * (P - 1) / P * 16.0;
    if (zo.last_sync < 0) fail_all("0/1 Adam: no sync in the run (more --steps or a lower --var-freeze-step)");
    for (int i = 0; i < o.steps; ++i) {
      const int ph = zo.phase[size_t(i)];
      const bool compressed = ph == DSOPT_PHASE_COMPRESSED || ph == DSOPT_PHASE_SYNC;
      const double expect = ph == DSOPT_PHASE_FULL  ? fp32_bytes
                            : ph == DSOPT_PHASE_LOCAL ? status_bytes
                                                      : status_bytes + car_bytes(s, P, false);
      const double got = double(zo.bytes[size_t(i)]);
      if ((flat && (got < expect || got > expect + 64.0 * P)) || zo.compressed[size_t(i)] != int(compressed))
        fail_all("0/1 Adam: update " + std::to_string(i + 1) + " (phase " + std::to_string(ph) + ") sent " +
                 std::to_string(got) + " bytes, expected " + std::to_string(expect));
    }
    if (run_adam)
      for (int i = 0; zo.phase[size_t(i)] == DSOPT_PHASE_FULL; ++i)
        if (!same_loss(runs[0].loss[size_t(i)], zo.loss[size_t(i)], false))
          fail_all("0/1 Adam differs from Adam before its first 1-bit step (update " + std::to_string(i + 1) + ")");
  }
  // The compressed run and its uncompressed twin (Adam, or LAMB) share
  // their arithmetic up to the freeze: LAMB's twin is the same rule, bit for
  // bit; Adam's is AdamW's kernel, the same update up to rounding.
  if (runs.size() >= 2) {
    const RunResult &twin = runs[runs.size() - 2], &compressed = runs.back();
    for (int i = 0; i + 1 < o.freeze_step; ++i)
      if (!same_loss(twin.loss[size_t(i)], compressed.loss[size_t(i)], compressed.lamb))
        fail_all("the runs differ before the freeze (update " + std::to_string(i + 1) + ")");
  }

  if (g_rank == 0) {
    if (o.print_every > 0) {
      std::printf("\ntraining loss (mean over ranks of the batch losses):\n  %6s", "step");
      for (const RunResult& r : runs) std::printf(" %12s", r.name.c_str());
      std::printf("\n");
      for (int i = o.print_every - 1; i < o.steps; i += o.print_every) {
        std::printf("  %6d", i + 1);
        for (const RunResult& r : runs) std::printf(" %12.5f", r.loss[size_t(i)]);
        std::printf("%s\n", i + 1 == o.freeze_step ? "   <- freeze_step" : "");
      }
    }
    std::printf("\n%-30s %8s %9s %8s %11s %8s %9s %9s\n", "run: median over steps", "step s",
                "compute s", "dsopt s", "bytes/step", "total s", "last-10", "held-out");
    const size_t skip = 3;
    for (const RunResult& r : runs) {
      auto row = [&](const std::string& label, int want, bool with_loss) {
        const std::vector<int>* only = r.onebit ? &r.compressed : nullptr;
        // First step of the stage, then `skip` more left out.
        size_t from = 0;
        if (only)
          while (from < r.compressed.size() && r.compressed[from] != want) ++from;
        from += skip;
        uint64_t bytes = 0;
        for (size_t i = 0; i < r.bytes.size(); ++i)
          if (!only || r.compressed[i] == want) bytes = r.bytes[i];
        std::printf("%-30s %8.3f %9.3f %8.3f %11.4g", label.c_str(),
                    median_of(r.step_s, from, only, want), median_of(r.compute_s, from, only, want),
                    median_of(r.opt_s, from, only, want), double(bytes));
        if (with_loss)
          std::printf(" %8.1f %9.5f %9.5f\n", r.step_total_s, r.last10(), r.eval_final);
        else
          std::printf("\n");
      };
      if (!r.onebit) {
        row(r.name, 0, true);
      } else {
        row(r.name + ", warmup stage", 0, false);
        row(r.name + ", compression stage", 1, true);
      }
    }
    // What all-or-nothing compressed steps would cost (UndoSnapshot).
    const auto print_undo = [&](const RunResult& r) {
      if (r.undo_s.empty()) return;
      std::vector<int> exchanged;  // the steps whose update holds a compressed exchange
      for (int ph : r.phase) exchanged.push_back(ph == DSOPT_PHASE_COMPRESSED || ph == DSOPT_PHASE_SYNC);
      const double step = median_of(r.step_s, 0, &exchanged, 1);
      const double undo = median_of(r.undo_s, 0);
      std::printf("%s: undo snapshot of a compressed step (exp_avg, worker and server errors, %.1f MiB"
                  " per rank):\n  median %.4f s (min %.4f, max %.4f), %.1f%% of the median %s;"
                  " dsopt marks the optimizer failed instead\n",
                  r.name.c_str(), double(r.undo_bytes) / (1024.0 * 1024.0), undo,
                  *std::min_element(r.undo_s.begin(), r.undo_s.end()),
                  *std::max_element(r.undo_s.begin(), r.undo_s.end()), 100.0 * undo / step,
                  r.zoadam ? "1-bit or sync step" : "compression-stage step");
    };
    for (const RunResult& r : runs) print_undo(r);
    // The compressed run against Adam (the first run) and, with --lamb,
    // against LAMB without compression.
    for (size_t k = 0; !runs.empty() && runs.back().onebit && k + 1 < runs.size(); ++k) {
      const RunResult& b = runs.back();
      const RunResult& a = runs[k];
      const double base_step = median_of(a.step_s, skip);
      size_t from = size_t(o.freeze_step - 1) + skip;
      const double comp_step = median_of(b.step_s, from, &b.compressed, 1);
      double bytes_a = 0, bytes_b = 0;
      for (uint64_t x : a.bytes) bytes_a += double(x);
      for (uint64_t x : b.bytes) bytes_b += double(x);
      std::printf(
          "\n%s vs %s: compression-stage steps %.2fx faster (median); whole run\n"
          "%.2fx faster (sum of all step times, warmup included); %.2fx fewer bytes per step over\n"
          "the run; loss %+.2f%% (last 10 steps), %+.2f%% (held-out); above the floor of %.4f:\n"
          "%.5f vs %.5f (last 10), %.5f vs %.5f (held-out); held-out loss at the start %.5f\n",
          b.name.c_str(), a.name.c_str(), base_step / comp_step, a.step_total_s / b.step_total_s,
          bytes_a / bytes_b, 100.0 * (b.last10() / a.last10() - 1.0),
          100.0 * (b.eval_final / a.eval_final - 1.0), floor, b.last10() - floor, a.last10() - floor,
          b.eval_final - floor, a.eval_final - floor, a.eval_initial);
    }
    if (run_zoadam) {
      double zo_bytes = 0.0;
      for (uint64_t b : zo.bytes) zo_bytes += double(b);
      std::printf("%-30s %8.3f %9.3f %8.3f %11.4g %8.1f %9.5f %9.5f\n", "0/1 Adam, whole run (mean B)",
                  median_of(zo.step_s, skip), median_of(zo.compute_s, skip), median_of(zo.opt_s, skip),
                  zo_bytes / double(zo.bytes.size()), zo.step_total_s, zo.last10(), zo.eval_final);
      int count[5] = {0, 0, 0, 0, 0};
      for (int ph : zo.phase) ++count[ph];
      std::printf("0/1 Adam: %d full, %d 1-bit, %d local, %d sync steps\n", count[DSOPT_PHASE_FULL],
                  count[DSOPT_PHASE_COMPRESSED], count[DSOPT_PHASE_LOCAL], count[DSOPT_PHASE_SYNC]);
      print_undo(zo);
      if (run_adam) {
        const RunResult& a = runs[0];
        double adam_bytes = 0.0;
        for (uint64_t b : a.bytes) adam_bytes += double(b);
        std::printf(
            "0/1 Adam vs Adam over the whole run: average bytes per step %.4g vs %.4g (%.1fx less);\n"
            "whole run %.2fx faster (sum of step times); loss %+.2f%% (last 10 steps), %+.2f%%\n"
            "(held-out); held-out %.5f vs %.5f\n",
            zo_bytes / o.steps, adam_bytes / o.steps, adam_bytes / zo_bytes,
            a.step_total_s / zo.step_total_s, 100.0 * (zo.last10() / a.last10() - 1.0),
            100.0 * (zo.eval_final / a.eval_final - 1.0), zo.eval_final, a.eval_final);
      }
      std::printf(
          "checked (0/1 Adam): identical parameters on every rank after the last sync; losses\n"
          "         equal to Adam's (to 1e-5) up to the first 1-bit step; bytes per step as each\n"
          "         step's phase says\n");
    }
    if (run_onebit)
      std::printf(
          "checked: identical parameters on every rank; the same losses up to the freeze;\n"
          "         compressed = 1 from update %d on; bytes per step as the formulas say\n",
          o.freeze_step);
  }
  MPI_Finalize();
  return 0;
}
