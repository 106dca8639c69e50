// What the divergence check ("divergence_check", on by default) costs an
// AdamW step on the CPU: it needs the global gradient norm, whose sum of
// squares the update takes as it reads the gradients (one rank, nothing
// else wanting the norm before the update), or rides on a pass that reads
// every gradient anyway (clipping's, or with several ranks the averaging
// pass). Each row is timed against its baseline, the same config with
// "divergence_check": {"enabled": false}:
//   - the default config (skip_nonfinite true): the update adds the sum of
//     squares; the non-finite check's read pass is in both;
//   - "skip_nonfinite": false, where nothing else reads the gradients: the
//     update adds the sum of squares;
//   - "gradient_clipping": 1.0, which computes the norm anyway: the check
//     adds nothing but its few scalar operations.
// One rank (a local communicator); a baseline and its row are timed in
// interleaved rounds so that load from elsewhere hits both alike. Prints,
// per case, the median, min and max step time over the timed steps and the
// ratio of medians to the baseline.
//
//   divergence_check_cost [--numel N] [--tensors K] [--iters I] [--warmup W] [--threads T]
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace {

struct Options {
  int64_t numel;
  int tensors, iters, warmup, threads;
};

float param_init(int64_t i) { return bench::hash_unit(1, i); }
float grad_value(int64_t i) { return 1e-2f * bench::hash_unit(2, i); }

// The rows' configs besides the check: what each row adds to AdamW.
struct Variant {
  const char* name;
  const char* keys;
};
const Variant kVariants[] = {
    {"default config", ""},
    {"\"skip_nonfinite\": false", ", \"skip_nonfinite\": false"},
    {"\"gradient_clipping\": 1.0", ", \"gradient_clipping\": 1.0"},
};

std::string config(int threads, const Variant& v, bool check) {
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, \"threads\": %d%s%s}",
                threads, v.keys, check ? "" : ", \"divergence_check\": {\"enabled\": false}");
  return text;
}

// An AdamW optimizer over its own copy of the parameters, `tensors` pieces.
class Run {
 public:
  Run(const Options& o, const std::string& cfg, const float* grads) {
    params_ = bench::alloc_buffer<float>(o.numel);
    bench::parallel_fill(params_.get(), o.numel, param_init);
    const int64_t per = o.numel / o.tensors;
    for (int k = 0; k < o.tensors; ++k) {
      const int64_t begin = k * per, count = k + 1 == o.tensors ? o.numel - begin : per;
      p_.push_back(dsopt_tensor{params_.get() + begin, count, DSOPT_FLOAT32, 0});
      g_.push_back(dsopt_tensor{const_cast<float*>(grads) + begin, count, DSOPT_FLOAT32, 0});
    }
    BENCH_CHECK(dsopt_comm_create_local(&comm_));
    BENCH_CHECK(dsopt_create(&opt_, cfg.c_str(), comm_, p_.data(), int64_t(p_.size())));
  }
  ~Run() {
    dsopt_destroy(opt_);
    dsopt_comm_destroy(comm_);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void step() {
    dsopt_step_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    BENCH_CHECK(dsopt_step(opt_, g_.data(), int64_t(g_.size()), &info));
    if (info.skipped || info.diverging) bench::die("unexpected dsopt_step_info");
  }

 private:
  bench::Buffer<float> params_;
  std::vector<dsopt_tensor> p_, g_;
  dsopt_comm* comm_ = nullptr;
  dsopt_optimizer* opt_ = nullptr;
};

double max_of(const bench::Samples& s) { return *std::max_element(s.seconds.begin(), s.seconds.end()); }

void print(const char* name, const bench::Samples& s, const bench::Samples* baseline) {
  char ratio[32] = "baseline";
  if (baseline) std::snprintf(ratio, sizeof ratio, "%.3f", s.median() / baseline->median());
  std::printf("%-52s %10.3f %10.3f %10.3f %9s\n", name, 1e3 * s.median(), 1e3 * s.best(), 1e3 * max_of(s), ratio);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Flags flags(argc, argv);
  Options o;
  o.numel = flags.get("--numel", 16 << 20, 1 << 10, int64_t(1) << 32);
  o.tensors = int(flags.get("--tensors", 1, 1, 1 << 16));
  o.iters = int(flags.get("--iters", 30, 3, 100000));
  o.warmup = int(flags.get("--warmup", 3, 0, 100000));
  o.threads = int(flags.get("--threads", 1, 1, 1024));
  flags.finish("divergence_check_cost [--numel N] [--tensors K] [--iters I] [--warmup W] [--threads T]");

  std::printf("divergence_check_cost: %s, %" PRId64 " fp32 parameters in %d tensor(s), %d thread(s), "
              "%d timed steps per case (after %d)\n",
              bench::cpu_model().c_str(), o.numel, o.tensors, o.threads, o.iters, o.warmup);
  std::printf("%-52s %10s %10s %10s %9s\n", "case (AdamW step)", "median ms", "min ms", "max ms", "ratio");
  bench::Buffer<float> grads = bench::alloc_buffer<float>(o.numel);
  bench::parallel_fill(grads.get(), o.numel, grad_value);
  for (const Variant& v : kVariants) {
    Run off(o, config(o.threads, v, false), grads.get());
    Run on(o, config(o.threads, v, true), grads.get());
    const std::vector<bench::Samples> s =
        bench::time_interleaved(o.warmup, o.iters, {[&] { off.step(); }, [&] { on.step(); }});
    const std::string what = v.name;
    print((what + ", divergence_check off").c_str(), s[0], nullptr);
    print((what + ", divergence_check on").c_str(), s[1], &s[0]);
  }
  return 0;
}
