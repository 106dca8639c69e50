// Kernels for "device": "cpu": picks the instruction set once per process,
// splits work into fixed ranges and runs them on OpenMP threads. Ranges do
// not depend on the thread count, so results do not either.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#include "kernels/kernels.hpp"
#include "math/sum_squares.hpp"

namespace dsopt {
namespace {

bool cpu_has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
bool cpu_has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// The best instruction set of this CPU, or the one DSOPT_CPU_ISA names
// ("scalar", "avx2", "avx512"; an unavailable one falls back to the best).
const CpuIsa& select_isa() {
  __builtin_cpu_init();
  const char* want = std::getenv("DSOPT_CPU_ISA");
  const std::string w = want ? want : "";
  if (w == "scalar") return cpu_isa_scalar();
  if (w == "avx2" && cpu_has_avx2()) return cpu_isa_avx2();
  if (cpu_has_avx512() && (w.empty() || w == "avx512")) return cpu_isa_avx512();
  if (cpu_has_avx2()) return cpu_isa_avx2();
  return cpu_isa_scalar();
}

const CpuIsa& isa() {
  static const CpuIsa& chosen = select_isa();
  return chosen;
}

// Elements per unit of parallel work in the Adam update.
constexpr int64_t kAdamChunk = 1 << 16;

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {}
  Device device() const override { return Device::Cpu; }
  const char* name() const override { return isa().name; }

  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) fail(DSOPT_ENOMEM, "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return p;
  }
  void release(void* p) override { std::free(p); }
  void* host_staging(size_t bytes) override {
    if (bytes > staging_.size()) staging_.resize(bytes);
    return staging_.data();
  }

  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}

  void to_float(const TensorRef& src, float* dst) override { transform(&src, 1, 1.0f, dst, nullptr); }

  void from_float(const float* src, void* dst, DType dtype, int64_t n) override {
    const int64_t chunks = (n + kAdamChunk - 1) / kAdamChunk;
    const CpuIsa& k = isa();
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      k.from_float_range(src, dst, dtype, c * kAdamChunk, std::min(n, (c + 1) * kAdamChunk));
  }

  GradStats transform(const TensorRef* src, int64_t count, float mul, float* dst,
                      double* sumsq_host) override {
    // Work items: (tensor, sum block); block sums land in a per-tensor row.
    std::vector<int64_t> first_block(size_t(count) + 1, 0), out_offset(size_t(count), 0);
    for (int64_t i = 0; i < count; ++i) {
      first_block[i + 1] = first_block[i] + sum_blocks(src[i].numel);
      if (i + 1 < count) out_offset[i + 1] = out_offset[i] + src[i].numel;
    }
    const int64_t blocks = first_block[size_t(count)];
    std::vector<double> block_sums(sumsq_host ? size_t(blocks) : 0);
    const CpuIsa& k = isa();
    int nonfinite = 0;
#pragma omp parallel num_threads(threads_) reduction(| : nonfinite)
    {
      int64_t t = 0;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b) {
        while (b >= first_block[t + 1]) ++t;
        while (b < first_block[t]) --t;
        const int64_t begin = (b - first_block[t]) * kSumBlock;
        const int64_t end = std::min(src[t].numel, begin + kSumBlock);
        float* out = dst ? dst + out_offset[t] + begin : nullptr;
        double* bs = sumsq_host ? &block_sums[size_t(b)] : nullptr;
        nonfinite |= k.transform_block(src[t], begin, end, mul, out, bs) ? 1 : 0;
      }
    }
    if (sumsq_host) {
      for (int64_t i = 0; i < count; ++i) {
        double s = 0.0;
        for (int64_t b = first_block[i]; b < first_block[i + 1]; ++b) s += block_sums[size_t(b)];
        sumsq_host[i] = s;
      }
    }
    GradStats st;
    st.nonfinite = nonfinite != 0;
    return st;
  }

  void adam_update(const AdamSlot* slots, int64_t count, const AdamConsts* consts, int32_t,
                   float mul1, float mul2) override {
    std::vector<int64_t> first(size_t(count) + 1, 0);
    for (int64_t i = 0; i < count; ++i)
      first[i + 1] = first[i] + (slots[i].numel + kAdamChunk - 1) / kAdamChunk;
    const int64_t chunks = first[size_t(count)];
    const CpuIsa& k = isa();
#pragma omp parallel num_threads(threads_)
    {
      int64_t t = 0;
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        while (c >= first[t + 1]) ++t;
        while (c < first[t]) --t;
        const AdamSlot& s = slots[t];
        const int64_t begin = (c - first[t]) * kAdamChunk;
        k.adam_range(s, begin, std::min(s.numel, begin + kAdamChunk), consts[s.group], mul1, mul2);
      }
    }
  }

 private:
  int threads_;
  std::vector<unsigned char> staging_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(int threads) { return std::make_unique<CpuKernels>(threads); }
const char* cpu_isa_name() { return isa().name; }

}  // namespace dsopt
