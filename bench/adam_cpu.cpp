// AdamW step throughput on the CPU, as bytes moved per second.
//
// One step of fp32 AdamW reads p, g, m, v and writes p, m, v: 28 bytes per
// parameter. With fp16/bf16 parameters and fp32 masters it reads the master
// (4), the 16-bit gradient (2), m (4), v (4) and writes the master (4), m
// (4), v (4) and the 16-bit parameter (2): 28 bytes too. The default config
// (skip_nonfinite true) reads the gradient once more to look for Inf/NaN:
// 32 bytes per fp32 parameter, 30 with 16-bit gradients. Counted bytes are what the algorithm must
// touch; write-allocate traffic of the hardware is not counted.
//
// Cases: a streaming probe with the same traffic and trivial arithmetic
// (what the memory system allows), a plain AdamW loop compiled with
// -O3 -march=native (what a straightforward implementation gets), and dsopt:
// one tensor, many tensors, each with the default config too, and 16-bit
// parameters with and without it. The
// cases of one family are timed in interleaved rounds, so that load from
// elsewhere on the machine hits them alike. Afterwards every AdamW case is
// checked against the plain loop run on a sample of the same elements for
// the same number of steps.
//
//   adam_cpu_bench [--numel N] [--tensors K] [--iters I] [--warmup W] [--threads T]
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "baselines.hpp"
#include "bench_util.hpp"

namespace {

using bench::Buffer;

struct Options {
  int64_t numel;  // parameters per case
  int tensors;    // tensor count of the multi-tensor case
  int iters, warmup, threads;
};

const bench::PlainAdamW kHyper{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
constexpr int kCheckSamples = 4096;

// Values every case starts from, by element index.
float param_init(int64_t i) { return bench::hash_unit(1, i); }
float grad_value(int64_t i) { return 1e-2f * bench::hash_unit(2, i); }
float zero(int64_t) { return 0.0f; }

// skip_nonfinite true leaves the key out (the default).
std::string adamw_config(int threads, bool skip_nonfinite) {
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": %g, \"betas\": [%g, %g],"
                " \"eps\": %g, \"weight_decay\": %g}}, \"threads\": %d%s}",
                double(kHyper.lr), double(kHyper.beta1), double(kHyper.beta2), double(kHyper.eps),
                double(kHyper.weight_decay), threads,
                skip_nonfinite ? "" : ", \"skip_nonfinite\": false");
  return text;
}

dsopt_tensor tensor(void* data, int64_t numel, int32_t dtype) {
  dsopt_tensor t;
  t.data = data;
  t.numel = numel;
  t.dtype = dtype;
  t.group = 0;
  return t;
}

// A dsopt optimizer on its own local communicator, released with the object.
class DsoptRun {
 public:
  DsoptRun(std::string name, const std::string& config, std::vector<dsopt_tensor> params,
           std::vector<dsopt_tensor> grads)
      : name_(std::move(name)), params_(std::move(params)), grads_(std::move(grads)) {
    BENCH_CHECK(dsopt_comm_create_local(&comm_));
    BENCH_CHECK(dsopt_create(&opt_, config.c_str(), comm_, params_.data(), int64_t(params_.size())));
  }
  ~DsoptRun() {
    dsopt_destroy(opt_);
    dsopt_comm_destroy(comm_);
  }
  DsoptRun(const DsoptRun&) = delete;
  DsoptRun& operator=(const DsoptRun&) = delete;

  void step() {
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    BENCH_CHECK(dsopt_step(opt_, grads_.data(), int64_t(grads_.size()), &info));
    if (info.skipped || info.step != ++steps_) bench::die(name_ + ": unexpected dsopt_step_info");
  }

 private:
  std::string name_;
  std::vector<dsopt_tensor> params_, grads_;
  dsopt_comm* comm_ = nullptr;
  dsopt_optimizer* opt_ = nullptr;
  int64_t steps_ = 0;
};

// One timed case of a family.
struct Case {
  std::string name;
  double bytes_per_elem;
  std::function<void()> step;
  std::function<float(int64_t)> param_at = {};  // the case's parameter i after the run; empty: no check
  const std::vector<float>* reference = nullptr;
  double rel_tol = 0.0;
};

// The plain loop on kCheckSamples evenly spaced elements, from the same start
// values and gradients, for the number of steps every case ran. `round`
// models the dtype the parameters and gradients of a case are stored in.
template <class Round>
std::vector<float> reference_sample(const Options& o, Round&& round) {
  const int64_t stride = o.numel / kCheckSamples;
  std::vector<float> p(kCheckSamples), g(kCheckSamples), m(kCheckSamples, 0.0f),
      v(kCheckSamples, 0.0f);
  for (int k = 0; k < kCheckSamples; ++k) {
    p[k] = round(param_init(k * stride));
    g[k] = round(grad_value(k * stride));
  }
  for (int t = 1; t <= o.warmup + o.iters; ++t)
    bench::plain_adamw_step(p.data(), g.data(), m.data(), v.data(), kCheckSamples, kHyper, t);
  return p;
}

// Worst relative difference between a case's parameters and the reference.
double worst_error(const Options& o, const Case& c) {
  const int64_t stride = o.numel / kCheckSamples;
  double worst = 0.0;
  for (int k = 0; k < kCheckSamples; ++k) {
    const double ref = (*c.reference)[size_t(k)];
    const double err = std::fabs(double(c.param_at(k * stride)) - ref) / std::max(std::fabs(ref), 1e-3);
    worst = std::max(worst, err);
  }
  return worst;
}

// Times the family, checks it and prints its rows. cases[0] is its probe;
// cases[plain] its plain loop (-1: none), the reference of the later rows.
void run_family(const Options& o, const std::vector<Case>& cases, int plain) {
  std::vector<std::function<void()>> steps;
  for (const Case& c : cases) steps.push_back(c.step);
  const std::vector<bench::Samples> samples = bench::time_interleaved(o.warmup, o.iters, steps);

  std::vector<bench::Result> results;
  for (size_t k = 0; k < cases.size(); ++k) {
    results.push_back(bench::Result{cases[k].name, cases[k].bytes_per_elem, o.numel, samples[k]});
    if (cases[k].param_at) {
      const double err = worst_error(o, cases[k]);
      if (!(err <= cases[k].rel_tol))
        bench::die(cases[k].name + ": parameters differ from the plain AdamW loop (max relative"
                                   " error " + std::to_string(err) + ")");
    }
  }
  for (size_t k = 0; k < cases.size(); ++k)
    bench::print_row(results[k], &results[0],
                     plain >= 0 && int(k) >= plain ? &results[size_t(plain)] : nullptr);
}

void run_fp32(const Options& o) {
  const int64_t n = o.numel;
  const std::vector<float> ref = reference_sample(o, [](float x) { return x; });
  const double tol = 1e-5;  // fp32 rounding differences over a few steps
  Buffer<float> g = bench::alloc_buffer<float>(n);
  bench::parallel_fill(g.get(), n, grad_value);

  auto fresh = [n](float (*init)(int64_t)) {
    Buffer<float> b = bench::alloc_buffer<float>(n);
    bench::parallel_fill(b.get(), n, init);
    return b;
  };
  Buffer<float> probe_p = fresh(param_init), probe_m = fresh(zero), probe_v = fresh(zero);
  Buffer<float> plain_p = fresh(param_init), plain_m = fresh(zero), plain_v = fresh(zero);
  Buffer<float> one_p = fresh(param_init), default_p = fresh(param_init);

  // Many tensors: separate parameter allocations, gradients sliced from g
  // (two sets: skip_nonfinite false and the default config).
  const int64_t per = n / o.tensors;
  std::vector<Buffer<float>> pieces, default_pieces;
  std::vector<dsopt_tensor> many_params, many_grads, default_many_params;
  for (int k = 0; k < o.tensors; ++k) {
    const int64_t begin = k * per, count = k + 1 == o.tensors ? n - begin : per;
    for (std::vector<Buffer<float>>* set : {&pieces, &default_pieces}) {
      set->push_back(bench::alloc_buffer<float>(count));
      bench::parallel_fill(set->back().get(), count,
                           [begin](int64_t i) { return param_init(begin + i); });
    }
    many_params.push_back(tensor(pieces.back().get(), count, DSOPT_FLOAT32));
    default_many_params.push_back(tensor(default_pieces.back().get(), count, DSOPT_FLOAT32));
    many_grads.push_back(tensor(g.get() + begin, count, DSOPT_FLOAT32));
  }
  const auto piece_at = [&o, per](const std::vector<Buffer<float>>& set) {
    return [&set, &o, per](int64_t i) {
      const int64_t k = std::min<int64_t>(i / per, o.tensors - 1);
      return set[size_t(k)][i - k * per];
    };
  };

  const std::string one_name = "dsopt AdamW fp32, 1 x " + std::to_string(n);
  const std::string many_name =
      "dsopt AdamW fp32, " + std::to_string(o.tensors) + " x " + std::to_string(per);
  const std::string default_name = "dsopt AdamW fp32, default config, 1 x " + std::to_string(n);
  const std::string default_many_name = "dsopt AdamW fp32, default config, " +
                                        std::to_string(o.tensors) + " x " + std::to_string(per);
  DsoptRun one(one_name, adamw_config(o.threads, false),
               {tensor(one_p.get(), n, DSOPT_FLOAT32)}, {tensor(g.get(), n, DSOPT_FLOAT32)});
  DsoptRun many(many_name, adamw_config(o.threads, false), many_params, many_grads);
  DsoptRun dflt(default_name, adamw_config(o.threads, true),
                {tensor(default_p.get(), n, DSOPT_FLOAT32)}, {tensor(g.get(), n, DSOPT_FLOAT32)});
  DsoptRun default_many(default_many_name, adamw_config(o.threads, true), default_many_params,
                        many_grads);

  int64_t plain_t = 0;
  std::vector<Case> cases;
  cases.push_back({"probe fp32: read 4 + write 3 arrays", 28,
                   [&] { bench::probe_f32(probe_p.get(), g.get(), probe_m.get(), probe_v.get(), n); }});
  cases.push_back({"plain AdamW loop fp32, 1 tensor", 28,
                   [&] {
                     bench::plain_adamw_step(plain_p.get(), g.get(), plain_m.get(), plain_v.get(),
                                             n, kHyper, ++plain_t);
                   },
                   [&](int64_t i) { return plain_p[i]; }, &ref, tol});
  cases.push_back({one_name, 28, [&] { one.step(); }, [&](int64_t i) { return one_p[i]; }, &ref,
                   tol});
  cases.push_back({many_name, 28, [&] { many.step(); }, piece_at(pieces), &ref, tol});
  cases.push_back({default_name, 32, [&] { dflt.step(); },
                   [&](int64_t i) { return default_p[i]; }, &ref, tol});
  cases.push_back({default_many_name, 32, [&] { default_many.step(); }, piece_at(default_pieces),
                   &ref, tol});
  run_family(o, cases, 1);
}

void run_16bit(const Options& o) {
  const int64_t n = o.numel;
  struct Kind {
    const char* name;
    int32_t dtype;
    uint16_t (*to_bits)(float);
    float (*from_bits)(uint16_t);
    double ulp;  // relative rounding step of the dtype
  };
  const Kind kinds[] = {
      {"fp16", DSOPT_FLOAT16, bench::to_f16_bits, bench::from_f16_bits, std::ldexp(1.0, -10)},
      {"bf16", DSOPT_BFLOAT16, bench::to_bf16_bits, bench::from_bf16_bits, std::ldexp(1.0, -7)},
  };

  auto fresh32 = [n](float (*init)(int64_t)) {
    Buffer<float> b = bench::alloc_buffer<float>(n);
    bench::parallel_fill(b.get(), n, init);
    return b;
  };
  auto fresh16 = [n](const Kind& kind, float (*init)(int64_t)) {
    Buffer<uint16_t> b = bench::alloc_buffer<uint16_t>(n);
    bench::parallel_fill(b.get(), n, [&](int64_t i) { return kind.to_bits(init(i)); });
    return b;
  };

  // The probe moves bf16-style 16-bit data (a shift converts it).
  Buffer<float> probe_master = fresh32(param_init), probe_m = fresh32(zero), probe_v = fresh32(zero);
  Buffer<uint16_t> probe_g = fresh16(kinds[1], grad_value), probe_p = fresh16(kinds[1], zero);

  std::vector<Case> cases;
  cases.push_back({"probe 16-bit: rd 4+2+4+4, wr 4+4+4+2", 28, [&] {
                     bench::probe_16(probe_master.get(), probe_g.get(), probe_m.get(),
                                     probe_v.get(), probe_p.get(), n);
                   }});

  std::vector<Buffer<uint16_t>> buffers;
  std::vector<std::vector<float>> refs;
  std::vector<std::unique_ptr<DsoptRun>> runs;
  refs.reserve(2);
  for (const Kind& kind : kinds) {
    refs.push_back(reference_sample(o, [&](float x) { return kind.from_bits(kind.to_bits(x)); }));
    buffers.push_back(fresh16(kind, grad_value));
    uint16_t* g16 = buffers.back().get();
    for (bool by_default : {false, true}) {
      buffers.push_back(fresh16(kind, param_init));
      uint16_t* p16 = buffers.back().get();
      const std::string name = std::string("dsopt AdamW ") + kind.name + " params+grads, fp32 master" +
                               (by_default ? ", default config" : "");
      runs.push_back(std::make_unique<DsoptRun>(name, adamw_config(o.threads, by_default),
                                                std::vector<dsopt_tensor>{tensor(p16, n, kind.dtype)},
                                                std::vector<dsopt_tensor>{tensor(g16, n, kind.dtype)}));
      DsoptRun* run = runs.back().get();
      float (*from_bits)(uint16_t) = kind.from_bits;
      cases.push_back({name, by_default ? 30.0 : 28.0, [run] { run->step(); },
                       [p16, from_bits](int64_t i) { return from_bits(p16[i]); }, &refs.back(),
                       kind.ulp});
    }
  }
  run_family(o, cases, -1);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Flags flags(argc, argv);
  Options o;
  o.numel = flags.get("--numel", 100000000, kCheckSamples, int64_t(1) << 34);
  o.tensors = int(flags.get("--tensors", 100, 1, 1 << 20));
  o.iters = int(flags.get("--iters", 10, 1, 100000));
  o.warmup = int(flags.get("--warmup", 2, 0, 100000));
  o.threads = int(flags.get("--threads", 2, 1, 4096));
  flags.finish("adam_cpu_bench [--numel N] [--tensors K] [--iters I] [--warmup W] [--threads T]");
  if (o.numel / o.tensors < 1) bench::die("--tensors larger than --numel");
  omp_set_num_threads(o.threads);

  std::printf("dsopt AdamW CPU step throughput (bytes counted per element / step time)\n");
  std::printf("dsopt:   %s\n", dsopt_build_info());
  std::printf("machine: %s; %d threads (OMP_NUM_THREADS=%s, OMP_PROC_BIND=%s)\n",
              bench::cpu_model().c_str(), o.threads, bench::env_or("OMP_NUM_THREADS", "unset"),
              bench::env_or("OMP_PROC_BIND", "unset"));
  std::printf("run:     %lld parameters per case, %d warm-up + %d timed steps, cases interleaved;\n"
              "         GB = 1e9 bytes; ratios are best vs best; dsopt config: AdamW lr 1e-3,\n"
              "         wd 0.01, \"threads\": %d, \"skip_nonfinite\": false except \"default\"\n\n",
              static_cast<long long>(o.numel), o.warmup, o.iters, o.threads);

  bench::print_table_header("vs probe", "vs plain");
  run_fp32(o);
  run_16bit(o);
  std::printf("\nchecked: every AdamW case matches the plain loop on %d sampled elements\n",
              kCheckSamples);
  return 0;
}
