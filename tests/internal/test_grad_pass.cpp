// The CPU gradient pass (Kernels::transform, accumulate) of the instruction
// set DSOPT_CPU_ISA picks, on 1, 2 and 3 threads, against a reference
// written here one element at a time: the values written, the non-finite
// flag, and every tensor's sum of squares in the order of
// math/sum_squares.hpp, bit for bit. Random fp32, fp16 and bf16 tensors of
// sizes around the vector widths, the sum block and the pass's unit of
// parallel work, alone and many at once (hundreds of small ones, of mixed
// dtypes), with Inf and NaN at odd
// positions, in vector tails and block tails, or nowhere; and in a forked
// child. The same sums taken by the update as it reads the gradients
// (Kernels::update with sums): the reference's sums, and the update's
// results those of the update without them.
//
//   DSOPT_CPU_ISA=avx2 test_grad_pass    (prints the ISA that ran)
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "math/adam.hpp"
#include "math/half.hpp"
#include "math/sum_squares.hpp"

namespace {

using dsopt::DType;
using dsopt::TensorRef;

int g_failures = 0, g_checks = 0;

void check(bool ok, const std::string& what) {
  ++g_checks;
  if (ok) return;
  if (++g_failures <= 20) std::printf("FAIL: %s\n", what.c_str());
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct Tensor {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> half;
  int64_t numel() const { return dtype == DType::F32 ? int64_t(f32.size()) : int64_t(half.size()); }
  float at(int64_t i) const {
    switch (dtype) {
      case DType::F32: return f32[size_t(i)];
      case DType::F16: return dsopt::f16_to_float(half[size_t(i)]);
      case DType::BF16: return dsopt::bf16_to_float(half[size_t(i)]);
    }
    return 0.0f;
  }
  TensorRef ref() const {
    return TensorRef{dtype == DType::F32 ? static_cast<const void*>(f32.data()) : half.data(), numel(), dtype};
  }
};

// Values of |x| up to 8 (squares and sums that round), with `bad` Inf/NaN.
Tensor make_tensor(std::mt19937_64& rng, DType dtype, int64_t n, const std::vector<int64_t>& bad) {
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  const float specials[3] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN()};
  for (size_t k = 0; k < bad.size(); ++k)
    if (bad[k] >= 0 && bad[k] < n) v[size_t(bad[k])] = specials[k % 3];
  Tensor t{dtype, {}, {}};
  if (dtype == DType::F32) {
    t.f32 = v;
  } else {
    for (float x : v) t.half.push_back(dtype == DType::F16 ? dsopt::float_to_f16(x) : dsopt::float_to_bf16(x));
  }
  return t;
}

// The sum of squares of y in the documented order: blocks of kSumBlock,
// lane k % kSumLanes of a block adds its squares in order, the lanes
// combine by the halving tree, the blocks add in order.
double reference_sum(const std::vector<float>& y) {
  double total = 0.0;
  for (size_t b = 0; b < y.size(); b += size_t(dsopt::kSumBlock)) {
    std::vector<double> lanes(size_t(dsopt::kSumLanes), 0.0);
    const size_t end = std::min(y.size(), b + size_t(dsopt::kSumBlock));
    for (size_t i = b; i < end; ++i) {
      const double d = double(y[i]);
      lanes[(i - b) % size_t(dsopt::kSumLanes)] += d * d;
    }
    for (int s = dsopt::kSumLanes / 2; s >= 1; s >>= 1)
      for (int j = 0; j < s; ++j) lanes[size_t(j)] += lanes[size_t(j + s)];
    total += lanes[0];
  }
  return total;
}

void run_case(const std::vector<Tensor>& tensors, float mul, const std::string& name) {
  std::vector<TensorRef> refs;
  int64_t total = 0;
  bool want_bad = false;
  std::vector<std::vector<float>> want_y;
  std::vector<float> start;  // accumulate's dst before the pass
  std::mt19937_64 rng(uint64_t(total) + tensors.size());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Tensor& t : tensors) {
    refs.push_back(t.ref());
    std::vector<float> y(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float x = t.at(i);
      want_bad |= !std::isfinite(x);
      y[size_t(i)] = x * mul;
      start.push_back(u(rng));
    }
    total += t.numel();
    want_y.push_back(y);
  }
  for (int threads : {1, 2, 3}) {
    const std::unique_ptr<dsopt::Kernels> k = dsopt::make_cpu_kernels(threads);
    const std::string at = name + " threads=" + std::to_string(threads);
    const int64_t count = int64_t(refs.size());

    // The check alone, the check with sums, and the pass writing y.
    check(k->transform(refs.data(), count, mul, nullptr, nullptr).nonfinite == want_bad, at + ": check alone");
    std::vector<double> sums(refs.size(), -1.0), sums_written(refs.size(), -1.0);
    check(k->transform(refs.data(), count, mul, nullptr, sums.data()).nonfinite == want_bad, at + ": check with sums");
    std::vector<float> dst(size_t(total), 0.0f);
    check(k->transform(refs.data(), count, mul, dst.data(), sums_written.data()).nonfinite == want_bad,
          at + ": check writing y");
    int64_t off = 0;
    for (size_t t = 0; t < refs.size(); ++t) {
      const double want = reference_sum(want_y[t]);
      check(same_bits(sums[t], want), at + ": sum of tensor " + std::to_string(t));
      check(same_bits(sums_written[t], want), at + ": sum (writing) of tensor " + std::to_string(t));
      bool same = true;
      for (size_t i = 0; i < want_y[t].size(); ++i) same &= same_bits(dst[size_t(off) + i], want_y[t][i]);
      check(same, at + ": y of tensor " + std::to_string(t));
      off += int64_t(want_y[t].size());
    }

    // accumulate: dst = fl(dst + x).
    std::vector<float> acc = start;
    check(k->accumulate(refs.data(), count, acc.data()).nonfinite == want_bad, at + ": accumulate's check");
    bool same = true;
    off = 0;
    for (const Tensor& t : tensors)
      for (int64_t i = 0; i < t.numel(); ++i, ++off)
        same &= same_bits(acc[size_t(off)], start[size_t(off)] + t.at(i));
    check(same, at + ": accumulated values");
  }
}

// AdamW (two groups) over the tensors as gradients, with fp32 or 16-bit
// parameters (masters), once plainly and once summing: the sums must be
// the reference's (the gradients' values, before the multipliers) and
// every parameter, master and moment the same bits.
void run_update_case(const std::vector<Tensor>& grads, const std::string& name) {
  struct State {
    std::vector<std::vector<float>> p, m, v;
    std::vector<std::vector<uint16_t>> p16;
  };
  std::mt19937_64 rng(grads.size() * 7 + 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  State start;
  for (const Tensor& g : grads) {
    const size_t n = size_t(g.numel());
    std::vector<float> p(n), m(n), v(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = u(rng);
      m[i] = 0.1f * u(rng);
      v[i] = 0.01f * std::fabs(u(rng));
    }
    start.p.push_back(p);
    start.m.push_back(m);
    start.v.push_back(v);
    start.p16.push_back(std::vector<uint16_t>(n));
  }
  dsopt::AdamHyper h0, h1;
  h0.weight_decay = 0.01;
  h1.lr = 3e-4;
  h1.beta1 = 0.8;
  const dsopt::AdamConsts consts[2] = {dsopt::adam_consts(h0, 3), dsopt::adam_consts(h1, 7)};
  const auto run = [&](dsopt::Kernels& k, bool sixteen, double* sums) {
    State s = start;
    std::vector<dsopt::UpdateSlot> slots;
    for (size_t t = 0; t < grads.size(); ++t) {
      const DType p16 = t % 2 ? DType::BF16 : DType::F16;
      slots.push_back(dsopt::moment_slot(s.p[t].data(), sixteen ? s.p16[t].data() : nullptr, p16,
                                         grads[t].ref().data, grads[t].dtype, s.m[t].data(),
                                         s.v[t].data(), grads[t].numel(), int32_t(t % 2)));
    }
    k.update(dsopt::UpdateRule::Adam, slots.data(), int64_t(slots.size()), consts, 2, 0.5f, 0.25f,
             sums);
    return s;
  };
  const auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof a[0]) == 0;
  };
  for (int threads : {1, 2, 3})
    for (bool sixteen : {false, true}) {
      const std::unique_ptr<dsopt::Kernels> k = dsopt::make_cpu_kernels(threads);
      const std::string at = name + " threads=" + std::to_string(threads) +
                             (sixteen ? " 16-bit params" : "") + ": update with sums";
      std::vector<double> sums(grads.size(), -1.0);
      const State plain = run(*k, sixteen, nullptr);
      const State summed = run(*k, sixteen, sums.data());
      for (size_t t = 0; t < grads.size(); ++t) {
        std::vector<float> g(size_t(grads[t].numel()));
        for (size_t i = 0; i < g.size(); ++i) g[i] = grads[t].at(int64_t(i));
        check(same_bits(sums[t], reference_sum(g)), at + ": sum of tensor " + std::to_string(t));
        check(same(plain.p[t], summed.p[t]) && same(plain.m[t], summed.m[t]) &&
                  same(plain.v[t], summed.v[t]) && same(plain.p16[t], summed.p16[t]),
              at + ": results of tensor " + std::to_string(t));
      }
    }
}

}  // namespace

int main() {
  std::printf("isa %s\n", dsopt::cpu_isa_name());
  std::mt19937_64 rng(44);
  const int64_t B = dsopt::kSumBlock;
  // The last: more than two units of parallel work (64 blocks each), each
  // read as 8 streams, with whole blocks and a short one left over.
  const std::vector<int64_t> sizes = {1,     7,     15,          16,     17,     33,      255,        257,
                                      B - 1, B,     B + 1,       B + 15, 3 * B + 100, 40000, 100003, 141 * B + 77};
  for (DType dtype : {DType::F32, DType::F16, DType::BF16}) {
    const std::string dt = dtype == DType::F32 ? "f32" : dtype == DType::F16 ? "f16" : "bf16";
    for (int64_t n : sizes) {
      // Clean; one Inf in the last element (a vector or block tail); NaN and
      // Inf at odd positions inside.
      const std::vector<std::vector<int64_t>> bads = {{}, {n - 1}, {n / 3 | 1, n / 2 | 1, n - 2}};
      for (size_t b = 0; b < bads.size(); ++b) {
        const Tensor t = make_tensor(rng, dtype, n, bads[b]);
        run_case({t}, 0.37f, dt + " n=" + std::to_string(n) + " bad#" + std::to_string(b));
      }
    }
    // Many tensors at once (one pass over all of them), one of them bad or none.
    for (int bad = -1; bad < 3; ++bad) {
      std::vector<Tensor> many;
      for (int i = 0; i < 40; ++i) {
        const int64_t n = sizes[size_t(i) % sizes.size()];
        many.push_back(make_tensor(rng, dtype, n, i == bad * 13 + 1 ? std::vector<int64_t>{n / 2} : std::vector<int64_t>{}));
      }
      run_case(many, 1.0f, dt + " 40 tensors bad=" + std::to_string(bad));
    }
  }
  // Many small tensors, a block or less each (several read side by side as
  // streams, runs going on from one tensor into the next), more than one
  // unit of parallel work, the dtype changing between some of them (a run
  // stops there), one of them bad or none.
  for (int bad = -1; bad < 2; ++bad) {
    std::uniform_int_distribution<int64_t> len(1, B);
    std::vector<Tensor> small;
    for (int i = 0; i < 300; ++i) {
      const DType dtype = i % 60 < 45 ? DType::F32 : i % 2 ? DType::BF16 : DType::F16;
      const int64_t n = i % 9 == 0 ? B : i % 31 == 0 ? 2 * B + 5 : len(rng);
      small.push_back(make_tensor(rng, dtype, n, i == bad * 101 + 57 ? std::vector<int64_t>{n - 1} : std::vector<int64_t>{}));
    }
    run_case(small, 0.81f, "300 small tensors bad=" + std::to_string(bad));
    if (bad < 0) run_update_case(small, "300 small tensors");
  }
  // The update's sums on tensors around the block and vector sizes, and on
  // one of several units of parallel work, one with Inf, -Inf and NaN.
  {
    std::vector<Tensor> mixed;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const DType dtype = i % 3 == 0 ? DType::F32 : i % 3 == 1 ? DType::BF16 : DType::F16;
      mixed.push_back(make_tensor(rng, dtype, sizes[i], i == 9 ? std::vector<int64_t>{B - 1, 3, 100} : std::vector<int64_t>{}));
    }
    run_update_case(mixed, "sizes around the blocks");
  }
  // A fork's child runs the pass on threads of its own (the parent's pool
  // threads do not exist there); a hang here ends in the test's timeout.
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    const Tensor t = make_tensor(rng, DType::F32, 100003, {});
    const int before = g_failures;
    run_case({t}, 0.5f, "in a forked child");
    _exit(g_failures == before ? 0 : 1);
  }
  int status = 0;
  check(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the pass in a forked child");
  std::printf("%d checks, %d failed\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
