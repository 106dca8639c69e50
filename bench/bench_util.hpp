// Shared pieces of the dsopt benchmarks: timing, aligned buffers filled in
// parallel, command-line flags, status checks and the result table.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dsopt.h"

namespace bench {

// ---- failures ---------------------------------------------------------------

[[noreturn]] inline void die(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "bench: %s\n", what.c_str());
  std::exit(1);
}

// Every dsopt status goes through this: a failed call ends the benchmark with
// the status text and dsopt_last_error().
#define BENCH_CHECK(call)                                                                  \
  do {                                                                                     \
    const int status_ = (call);                                                            \
    if (status_ != DSOPT_OK)                                                               \
      ::bench::die(std::string(#call) + " failed: " + dsopt_status_string(status_) + " (" + \
                   std::to_string(status_) + "): " + dsopt_last_error());                  \
  } while (0)

// ---- timing -----------------------------------------------------------------

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

struct Samples {
  std::vector<double> seconds;

  double best() const { return *std::min_element(seconds.begin(), seconds.end()); }
  double median() const {
    std::vector<double> s = seconds;
    std::sort(s.begin(), s.end());
    const size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
};

// Runs `step` warmup times untimed, then `iters` times, timing each call.
template <class Step>
Samples time_steps(int warmup, int iters, Step&& step) {
  for (int i = 0; i < warmup; ++i) step();
  Samples s;
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_seconds();
    step();
    s.seconds.push_back(now_seconds() - t0);
  }
  return s;
}

// Times several steps in rounds (each round calls every step once) so that
// whatever else the machine is doing falls on all of them alike; returns one
// Samples per step, in order.
inline std::vector<Samples> time_interleaved(int warmup, int iters,
                                             const std::vector<std::function<void()>>& steps) {
  std::vector<Samples> out(steps.size());
  for (int i = 0; i < warmup; ++i)
    for (const auto& step : steps) step();
  for (int i = 0; i < iters; ++i) {
    for (size_t k = 0; k < steps.size(); ++k) {
      const double t0 = now_seconds();
      steps[k]();
      out[k].seconds.push_back(now_seconds() - t0);
    }
  }
  return out;
}

// ---- memory -----------------------------------------------------------------

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 64-byte aligned host memory, like dsopt's own state allocations.
template <class T>
using Buffer = std::unique_ptr<T[], FreeDeleter>;

template <class T>
Buffer<T> alloc_buffer(int64_t count) {
  const size_t bytes = (size_t(count) * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) die("cannot allocate " + std::to_string(bytes) + " bytes");
  return Buffer<T>(static_cast<T*>(p));
}

// A cheap deterministic value in [-1, 1) for element i of stream `seed`.
inline float hash_unit(uint64_t seed, int64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(i);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return float(int32_t(z >> 32)) * (1.0f / 2147483648.0f);
}

// Fills dst[i] = f(i) with the benchmark's threads (first touch on them too).
template <class T, class F>
void parallel_fill(T* dst, int64_t n, F&& f) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f(i);
}

// fp32 -> IEEE half / bfloat16 bits, round to nearest even, for preparing
// finite inputs (fp16: magnitudes below 2^-14 become zero).
inline uint16_t to_bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline float from_bf16_bits(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

inline uint16_t to_f16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = int32_t((u >> 23) & 0xFF) - 127 + 15;
  uint32_t mant = u & 0x7FFFFFu;
  if (exp <= 0) return uint16_t(sign);
  uint32_t h = (uint32_t(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

inline float from_f16_bits(uint16_t h) {  // finite values only
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
  float x;
  if (exp == 0) {
    x = std::ldexp(float(mant), -24);
  } else {
    const uint32_t u = ((exp - 15 + 127) << 23) | (mant << 13);
    std::memcpy(&x, &u, 4);
  }
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u |= sign;
  std::memcpy(&x, &u, 4);
  return x;
}

// ---- command line -----------------------------------------------------------

// "--name value" flags with integer values; unknown flags are errors.
class Flags {
 public:
  Flags(int argc, char** argv) : args_(argv + 1, argv + argc) {}

  int64_t get(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (args_[i] != name) continue;
      if (i + 1 >= args_.size()) die(std::string(name) + " needs a value");
      char* end = nullptr;
      const long long v = std::strtoll(args_[i + 1].c_str(), &end, 10);
      if (*end || v < lo || v > hi)
        die(std::string("bad value for ") + name + ": '" + args_[i + 1] + "'");
      args_.erase(args_.begin() + long(i), args_.begin() + long(i) + 2);
      return v;
    }
    return fallback;
  }

  // A text value.
  std::string text(const char* name, const std::string& fallback) {
    for (size_t i = 0; i < args_.size(); ++i) {
      if (args_[i] != name) continue;
      if (i + 1 >= args_.size()) die(std::string(name) + " needs a value");
      const std::string v = args_[i + 1];
      args_.erase(args_.begin() + long(i), args_.begin() + long(i) + 2);
      return v;
    }
    return fallback;
  }

  // Call after every get(): rejects what is left.
  void finish(const char* usage) {
    if (!args_.empty()) die("unknown argument '" + args_[0] + "'\nusage: " + usage);
  }

 private:
  std::vector<std::string> args_;
};

// ---- machine ----------------------------------------------------------------

// Transmit counter of the loopback device in this network namespace; -1
// when it cannot be read.
inline long long lo_tx_bytes() {
  std::FILE* f = std::fopen("/sys/class/net/lo/statistics/tx_bytes", "r");
  if (!f) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

inline const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// ---- results ----------------------------------------------------------------

// One measured case: bytes counted per element and per-step times.
struct Result {
  std::string name;
  double bytes_per_elem;
  int64_t elems;
  Samples samples;

  double bytes_per_step() const { return bytes_per_elem * double(elems); }
  double best_rate() const { return bytes_per_step() / samples.best(); }      // B/s
  double median_rate() const { return bytes_per_step() / samples.median(); }  // B/s
};

// Rows carry up to two ratio columns: this case's best rate over a
// reference case's best rate ("-" where a row has no reference).
inline void print_table_header(const char* ratio1, const char* ratio2) {
  std::printf("%-44s %6s %9s %9s %9s %9s %8s %8s\n", "case", "B/elem", "best ms", "median ms",
              "best GB/s", "med GB/s", ratio1, ratio2);
}

inline void print_row(const Result& r, const Result* ref1 = nullptr,
                      const Result* ref2 = nullptr) {
  char c1[16] = "-", c2[16] = "-";
  if (ref1) std::snprintf(c1, sizeof c1, "%.2f", r.best_rate() / ref1->best_rate());
  if (ref2) std::snprintf(c2, sizeof c2, "%.2f", r.best_rate() / ref2->best_rate());
  std::printf("%-44s %6.0f %9.2f %9.2f %9.2f %9.2f %8s %8s\n", r.name.c_str(),
              r.bytes_per_elem, 1e3 * r.samples.best(), 1e3 * r.samples.median(),
              1e-9 * r.best_rate(), 1e-9 * r.median_rate(), c1, c2);
  std::fflush(stdout);
}

}  // namespace bench
