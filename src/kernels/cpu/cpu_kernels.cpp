// Kernels for "device": "cpu": picks the instruction set once per process,
// splits work into fixed ranges and runs them on the kernels' thread pool
// (thread_pool.hpp). Ranges do not depend on the thread count, so results
// do not either.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "kernels/cpu/block_grid.hpp"
#include "kernels/cpu/cpu_car.hpp"
#include "kernels/cpu/cpu_codec.hpp"
#include "kernels/cpu/cpu_isa.hpp"
#include "kernels/cpu/element_split.hpp"
#include "kernels/cpu/thread_pool.hpp"
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

// Elements per unit of parallel work in conversions and maxima.
constexpr int64_t kAdamChunk = 1 << 16;
// Sum blocks per unit of parallel work in the gradient pass (1 MiB of fp32,
// 8 streams of 8 blocks: cpu_loops.hpp transform_blocks_dt), of one tensor
// or of many small ones of one dtype; and in an update that sums.
constexpr int64_t kPassRun = 64;
// Threads of the non-finite check (more are not used by it).
constexpr int kMaxThreads = 256;

class CpuKernels final : public Kernels {
 public:
  explicit CpuKernels(int threads) : threads_(threads > 0 ? threads : omp_get_max_threads()) {}
  Device device() const override { return Device::Cpu; }
  int threads() const override { return threads_; }
  void set_threads(int threads) override { threads_ = threads; }
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
    parallel_for(threads_, chunks, [&](int64_t c) {
      k.from_float_range(src, dst, dtype, c * kAdamChunk, std::min(n, (c + 1) * kAdamChunk));
    });
  }

  GradStats transform(const TensorRef* src, int64_t count, float mul, float* dst,
                      double* sumsq_host) override {
    if (!dst && !sumsq_host) return check(src, count);
    return pass(src, count, mul, dst, false, sumsq_host);
  }

  GradStats accumulate(const TensorRef* src, int64_t count, float* dst) override {
    return pass(src, count, 1.0f, dst, true, nullptr);
  }

 private:
  // Only looks for Inf/NaN: no fixed blocks needed, the even split serves.
  GradStats check(const TensorRef* src, int64_t count) {
    const CpuIsa& k = isa();
    int found[kMaxThreads] = {};
    ElementSplit(count, [src](int64_t i) { return src[i].numel; })
        .run(std::min(threads_, kMaxThreads), [&](size_t t, int64_t b, int64_t e, int thread) {
          if (k.check_range(src[t], b, e)) found[thread] = 1;  // written only then: no sharing
        });
    GradStats st;
    for (int f : found) st.nonfinite |= f != 0;
    return st;
  }

  GradStats pass(const TensorRef* src, int64_t count, float mul, float* dst, bool add,
                 double* sumsq_host) {
    std::vector<int64_t> lengths, out_offset;
    int64_t offset = 0;
    for (int64_t i = 0; i < count; ++i) {
      lengths.push_back(src[i].numel);
      out_offset.push_back(offset);
      offset += src[i].numel;
    }
    const CpuIsa& k = isa();
    const BlockGrid grid(lengths);
    std::vector<int> nonfinite(size_t(grid.blocks()), 0);  // at each run's first block
    const auto same_dtype = [src](size_t t) { return src[t].dtype == src[t - 1].dtype; };
    grid.run_groups<kPassRun>(threads_, sumsq_host, same_dtype,
                    [&](const GridBlock* blocks, int64_t count, double* block_sums) {
                      PassBlock run[kPassRun];
                      for (int64_t i = 0; i < count; ++i) {
                        const GridBlock& b = blocks[i];
                        run[i] = PassBlock{src[b.tensor].data, b.begin, b.end - b.begin,
                                           dst ? dst + out_offset[b.tensor] + b.begin : nullptr,
                                           block_sums ? block_sums + i : nullptr};
                      }
                      nonfinite[size_t(blocks[0].block)] =
                          k.transform_blocks(src[blocks[0].tensor].dtype, run, count, mul, add);
                    });
    GradStats st;
    for (int f : nonfinite) st.nonfinite |= f != 0;
    return st;
  }

 public:
  void update_records(UpdateRule rule, const UpdateSlot* slots, int64_t count, const void* consts,
                      int32_t, float mul1, float mul2) override {
    const CpuIsa& k = isa();
    const auto* records = static_cast<const uint8_t*>(consts);
    const size_t bytes = rule_consts_bytes(rule);
    ElementSplit(count, [slots](int64_t i) { return slots[i].numel; })
        .run(threads_, [&](size_t t, int64_t b, int64_t e, int) {
          k.update_range(rule, slots[t], b, e, records + size_t(slots[t].group) * bytes, mul1, mul2,
                         nullptr);
        });
  }

  // The update cut into sum blocks instead of even ranges: runs of blocks
  // of all slots in parallel, each slot's consecutive blocks of a run in one
  // call that sums them as it updates.
  bool sums_while_updating() const override { return true; }
  void update_records_summed(UpdateRule rule, const UpdateSlot* slots, int64_t count,
                             const void* consts, int32_t, float mul1, float mul2,
                             double* sumsq_host) override {
    const CpuIsa& k = isa();
    const auto* records = static_cast<const uint8_t*>(consts);
    const size_t bytes = rule_consts_bytes(rule);
    std::vector<int64_t> lengths;
    for (int64_t i = 0; i < count; ++i) lengths.push_back(slots[i].numel);
    const BlockGrid grid(lengths);
    const auto any = [](size_t) { return true; };
    grid.run_groups<kPassRun>(
        threads_, sumsq_host, any, [&](const GridBlock* blocks, int64_t n, double* block_sums) {
          for (int64_t i = 0, j = 0; i < n; i = j) {
            while (j < n && blocks[j].tensor == blocks[i].tensor) ++j;
            const UpdateSlot& s = slots[blocks[i].tensor];
            k.update_range(rule, s, blocks[i].begin, blocks[j - 1].end,
                           records + size_t(s.group) * bytes, mul1, mul2, block_sums + i);
          }
        });
  }

  void max_per_tensor(const TensorRef* src, int64_t count, float* max_host) override {
    // Chunks of every tensor in parallel, then each tensor's chunk maxima.
    std::vector<int64_t> first(size_t(count) + 1, 0);
    for (int64_t i = 0; i < count; ++i)
      first[i + 1] = first[i] + (src[i].numel + kAdamChunk - 1) / kAdamChunk;
    std::vector<float> chunk_max(static_cast<size_t>(first[size_t(count)]));
    parallel_for(threads_, first[size_t(count)], [&](int64_t c) {
      const int64_t t = std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1;
      const float* x = static_cast<const float*>(src[t].data);
      const int64_t begin = (c - first[t]) * kAdamChunk;
      const int64_t end = std::min(src[t].numel, begin + kAdamChunk);
      float best = x[begin];
      for (int64_t i = begin + 1; i < end; ++i) best = x[i] > best ? x[i] : best;
      chunk_max[size_t(c)] = best;
    });
    for (int64_t t = 0; t < count; ++t) {
      float best = chunk_max[size_t(first[t])];
      for (int64_t c = first[t] + 1; c < first[t + 1]; ++c) best = std::max(best, chunk_max[size_t(c)]);
      max_host[t] = best;
    }
  }

  void codec_encode(BlockCodec c, int64_t block, const float* g, const uint8_t* e_in, float e_mul,
                    uint8_t* e_out, int64_t n, int runs, uint8_t* out) override {
    cpu_codec::encode(isa(), c, block, g, e_in, e_mul, e_out, n, runs, out, threads_);
  }
  void codec_decode_sum(BlockCodec c, int64_t block, const uint8_t* in, int runs, int64_t n,
                        float* dst) override {
    cpu_codec::decode_sum(isa(), c, block, in, runs, n, dst, threads_);
  }
  void car_worker_sumsq(const CarTensor* t, int64_t count, double* sumsq) override {
    cpu_car::worker_sumsq(isa(), t, count, threads_, sumsq);
  }
  void car_worker_pack(const CarTensor* t, int64_t count, int world, const float* scales,
                       uint8_t* send, int64_t msg_bytes) override {
    cpu_car::worker_pack(isa(), t, count, world, scales, send, msg_bytes, threads_);
  }
  void car_server_sum(const CarTensor* t, int64_t count, int world, const uint8_t* recv,
                      int64_t msg_bytes, const float* weights, double* sumsq) override {
    cpu_car::server_sum(isa(), t, count, world, recv, msg_bytes, weights, sumsq, threads_);
  }
  void car_server_pack(const CarTensor* t, int64_t count, int world, const float* scales,
                       uint8_t* out) override {
    cpu_car::server_pack(isa(), t, count, world, scales, out, threads_);
  }
  void car_decode(const CarTensor* t, int64_t count, int world, const uint8_t* gathered,
                  int64_t msg_bytes, const float* scales) override {
    cpu_car::decode(isa(), t, count, world, gathered, msg_bytes, scales, threads_);
  }

 private:
  int threads_;
  std::vector<unsigned char> staging_;
};

}  // namespace

std::unique_ptr<Kernels> make_cpu_kernels(int threads) { return std::make_unique<CpuKernels>(threads); }
const char* cpu_isa_name() { return isa().name; }

}  // namespace dsopt
