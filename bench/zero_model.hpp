// The model and the layout rules the ZeRO benchmarks share (zero_e2e.cpp,
// compressed_zero.cpp): tensor sizes, what src/zero makes of them, dsopt's
// allocations by the code's rules, the flat parameter and gradient
// buffers, and the checked calls both make.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "dsopt.h"
#include "mpi_fail.hpp"

namespace zero_model {

// Odd sizes: every third tensor small (a bias or a norm), the others large
// and all different; the last one takes the rest.
inline std::vector<int64_t> tensor_sizes(int64_t numel, int tensors) {
  std::vector<double> w;
  double sum = 0.0;
  for (int i = 0; i < tensors; ++i) {
    w.push_back(i % 3 == 2 ? 0.002 * (1 + i % 5) : 1.0 + 0.37 * double((i * 13) % 23));
    sum += w.back();
  }
  std::vector<int64_t> sizes;
  int64_t used = 0;
  for (int i = 0; i + 1 < tensors; ++i) {
    const int64_t n = std::max<int64_t>(1, int64_t(double(numel) * w[size_t(i)] / sum)) | 1;
    sizes.push_back(n);
    used += n;
  }
  int64_t last = numel - used;
  if (last < 1) return {};  // --numel too small for --tensors
  if (last % 2 == 0) ++last;  // Psi + 1
  sizes.push_back(last);
  return sizes;
}

// What src/zero/shard_layout.cpp and param_gatherer.cpp make of the model
// (recomputed here from the rules in their headers).
struct Layout {
  int64_t n = 0, padded = 0, shard = 0, bucket = 0, buckets = 0, largest_bucket = 0;
  int64_t ag_len = 0;  // L: elements per rank per allgather chunk
  int64_t ag_chunks = 0;
  std::vector<int64_t> real_in_shard;  // per rank: elements of the shard below n

  Layout(int64_t numel, int P, int64_t bucket_elems, int64_t ag_elems) : n(numel) {
    const int64_t align = 2 * int64_t(P);
    padded = (n + align - 1) / align * align;
    shard = padded / P;
    bucket = std::max(align, bucket_elems / align * align);
    real_in_shard.assign(size_t(P), 0);
    for (int64_t start = 0; start < padded; start += bucket) {
      const int64_t len = std::min(bucket, padded - start), piece = len / P;
      ++buckets;
      largest_bucket = std::max(largest_bucket, len);
      for (int r = 0; r < P; ++r) {
        const int64_t lo = start + r * piece, hi = std::min(lo + piece, n);
        if (hi > lo) real_in_shard[size_t(r)] += hi - lo;
      }
    }
    ag_len = std::min(shard, std::max<int64_t>(1, ag_elems / P));
    ag_chunks = (shard + ag_len - 1) / ag_len;
  }
};

// Bytes dsopt allocates on rank r, by the code's rules (see the top).
struct Expected {
  double masters = 0, moments = 0, grads = 0, reduce_buf = 0, ag_buf = 0, lamb = 0;
  double scratch() const { return std::max(reduce_buf, ag_buf); }  // one buffer serves both
  double total() const { return masters + moments + grads + scratch() + lamb; }
};

// cut: lamb_cut_numel (LAMB only).
inline Expected expected_zero(const Layout& L, int P, int r, bool half, bool lamb, int64_t cut) {
  Expected e;
  const double w = half ? 2.0 : 4.0;
  e.masters = half ? 4.0 * double(L.real_in_shard[size_t(r)]) : 0.0;
  e.moments = 8.0 * double(L.shard);
  e.grads = 4.0 * double(L.shard);
  if (P > 1) {
    e.reduce_buf = 4.0 * double(L.largest_bucket);
    e.ag_buf = double(L.ag_len) * w * double(1 + P);
  }
  if (lamb) e.lamb = 4.0 * double(L.shard) + 8.0 * double(cut);
  return e;
}

// n elements of one dtype, viewed as the model's tensors.
struct Flat {
  bool half;
  int64_t n;
  bench::Buffer<uint8_t> bytes;
  Flat(bool half_, int64_t n_) : half(half_), n(n_), bytes(bench::alloc_buffer<uint8_t>(n_ * (half_ ? 2 : 4))) {}
  float* f32() const { return reinterpret_cast<float*>(bytes.get()); }
  uint16_t* b16() const { return reinterpret_cast<uint16_t*>(bytes.get()); }
  size_t size() const { return size_t(n) * (half ? 2 : 4); }
  template <class F>
  void fill(F&& value) {
    if (half)
      bench::parallel_fill(b16(), n, [&](int64_t i) { return bench::to_bf16_bits(value(i)); });
    else
      bench::parallel_fill(f32(), n, [&](int64_t i) { return value(i); });
  }
  void fill_params() {
    fill([](int64_t i) { return 0.05f * bench::hash_unit(5001, i); });
  }
  // Multiples of 1/1024 in [-1/16, 1/16]: exact in bf16, and their sums
  // over ranks exact in fp32 in any order.
  void fill_grads(int rank) {
    fill([rank](int64_t i) {
      return std::floor(64.0f * bench::hash_unit(100 + uint64_t(rank), i)) / 1024.0f;
    });
  }
  std::vector<dsopt_tensor> views(const std::vector<int64_t>& sizes) const {
    std::vector<dsopt_tensor> v;
    uint8_t* p = bytes.get();
    for (int64_t s : sizes) {
      v.push_back(dsopt_tensor{p, s, half ? DSOPT_BFLOAT16 : DSOPT_FLOAT32, 0});
      p += s * (half ? 2 : 4);
    }
    return v;
  }
  uint64_t fingerprint() const {
    uint64_t h = 1469598103934665603ull;
    const uint8_t* p = bytes.get();
    for (size_t i = 0; i < size(); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};

// ---- checked calls ------------------------------------------------------------
// `fail` is the benchmark's own fail_all: it ends every rank, never returns.
using FailAll = void (*)(const std::string& what);

inline std::vector<int64_t> model_sizes(int64_t numel, int tensors, FailAll fail) {
  std::vector<int64_t> sizes = tensor_sizes(numel, tensors);
  if (sizes.empty()) fail("--numel too small for --tensors");
  return sizes;
}

// One dsopt_step that must succeed and not skip.
inline dsopt_step_info checked_step(dsopt_optimizer* opt, const std::vector<dsopt_tensor>& g,
                                    FailAll fail) {
  dsopt_step_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  const std::string failure =
      bench::call_failure(dsopt_step(opt, g.data(), int64_t(g.size()), &info), "dsopt_step");
  if (!failure.empty()) fail(failure);
  if (info.skipped) fail("a step was skipped");
  return info;
}

// dsopt_memory_usage's host bytes of a CPU optimizer.
inline uint64_t host_usage(const dsopt_optimizer* opt, FailAll fail) {
  uint64_t host = 0, device = 0;
  const std::string failure =
      bench::call_failure(dsopt_memory_usage(opt, &host, &device), "dsopt_memory_usage");
  if (!failure.empty()) fail(failure);
  if (device != 0) fail("dsopt_memory_usage reports device bytes for a CPU optimizer");
  return host;
}

// Collective: every rank holds the same parameters.
inline void same_on_every_rank(const Flat& p, const std::string& what, FailAll fail) {
  const uint64_t h = p.fingerprint();
  uint64_t lo = 0, hi = 0;
  MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (lo != hi) fail(what + ": ranks ended with different parameters");
}

}  // namespace zero_model
