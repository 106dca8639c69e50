// libFuzzer target: untrusted values through the block codecs of compressed
// ZeRO (src/math/block_codec.hpp, the CPU kernels' codec_encode and
// codec_decode_sum).
//
// Input: byte 0 picks the codec (int8, int4, sign), byte 1 the block (8 to
// 64 elements), byte 2 the number of runs (1 to 3), whether a residual
// is added and whether it is halved first (a loss scale that changed); the
// rest are the fp32 bit patterns of the values (then of the residual, which
// is encoded into its int8 runs first): every NaN, Inf, denormal and zero
// the fuzzer makes. Properties (abort() when one fails):
//  - the kernels write exactly codec_run_bytes per run and agree with the
//    block functions called one block at a time;
//  - a block with a non-finite input decodes to NaN everywhere; otherwise
//    every decoded value is finite: an int level is within half a scale
//    step of the input (scales of at least FLT_MIN), a sign value is +-s
//    with s the block's mean magnitude;
//  - the new residual is the int8 encoding of fl(x - x'), the same when it
//    overwrites the residual it started from, and decode_sum is the sum
//    over runs in run order.
//
//   fuzz_block_codec --write-seeds DIR   writes the seed corpus and exits.
#include <sys/stat.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/kernels.hpp"
#include "fuzz_seeds.hpp"

namespace {

using dsopt::BlockCodec;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "fuzz_block_codec: PROPERTY VIOLATED: %s\n", what);
  std::abort();
}

dsopt::Kernels& kernels() {
  static std::unique_ptr<dsopt::Kernels> k = dsopt::make_cpu_kernels(2);
  return *k;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

void check_block(BlockCodec c, int64_t block, const float* x, int64_t len, const uint8_t* rec,
                 const uint8_t* err) {
  float s;
  std::memcpy(&s, rec, 4);
  bool finite = true;
  double magnitude = 0.0;
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    finite = finite && std::isfinite(x[i]);
    magnitude += double(std::fabs(x[i]));
    amax = std::fmax(amax, std::fabs(x[i]));
  }
  if (err) {
    std::vector<float> lost(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) lost[size_t(i)] = x[i] - dsopt::decode_element(c, rec, i);
    std::vector<uint8_t> want(static_cast<size_t>(dsopt::codec_record_bytes(BlockCodec::Int8, block)));
    dsopt::encode_values(BlockCodec::Int8, block, dsopt::PlainValues{lost.data()}, len, want.data());
    if (std::memcmp(want.data(), err, want.size()) != 0) die("the residual is not the int8 encoding of x - x'");
  }
  for (int64_t i = 0; i < len; ++i) {
    const float d = dsopt::decode_element(c, rec, i);
    if (!finite) {
      if (!std::isnan(d)) die("a block with Inf/NaN decodes to a non-NaN value");
      continue;
    }
    if (!std::isfinite(d)) die("a finite block decodes to a non-finite value");
    if (c == BlockCodec::Sign) {
      if (!same_bits(std::fabs(d), s) || !same_bits(s, float(magnitude / double(len))))
        die("a sign value is not +-(mean magnitude)");
      if ((x[i] < 0.0f) != (d < 0.0f) && s > 0.0f) die("a sign value has the wrong sign");
    } else {
      const float limit = c == BlockCodec::Int8 ? 127.0f : 7.0f;
      const float want = std::isfinite(limit * (amax / limit)) ? amax / limit : std::nextafter(amax / limit, 0.0f);
      if (!same_bits(s, want)) die("the scale is not amax / limit");
      if (s >= FLT_MIN && std::fabs(double(x[i]) - double(d)) >
                              0.5001 * double(s) + std::fabs(double(x[i])) * 1e-6)
        die("an int level is more than half a step from its input");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const BlockCodec c = BlockCodec(1 + data[0] % 3);
  const int64_t block = 8 * (1 + data[1] % 8);
  const int runs = 1 + data[2] % 3;
  const bool feedback = (data[2] / 3) % 2 == 1;
  const float e_mul = (data[2] / 6) % 2 ? 0.5f : 1.0f;  // a loss scale halved since e was made
  const size_t floats = (size - 3) / 4;
  const int64_t n = int64_t(feedback ? floats / 2 : floats) / runs;
  if (n == 0) return 0;
  std::vector<float> g(size_t(n * runs)), e(feedback ? g.size() : 0);
  std::memcpy(g.data(), data + 3, g.size() * 4);
  if (feedback) std::memcpy(e.data(), data + 3 + g.size() * 4, e.size() * 4);

  const int64_t run_bytes = dsopt::codec_run_bytes(c, block, n);
  const int64_t record = dsopt::codec_record_bytes(c, block);
  const int64_t e_run_bytes = dsopt::codec_run_bytes(BlockCodec::Int8, block, n);
  const int64_t e_record = dsopt::codec_record_bytes(BlockCodec::Int8, block);
  // The residual's int8 runs, from the fuzzer's values.
  std::vector<uint8_t> e_in(size_t(e_run_bytes * runs));
  if (feedback)
    kernels().codec_encode(BlockCodec::Int8, block, e.data(), nullptr, 1.0f, nullptr, n, runs, e_in.data());
  std::vector<uint8_t> out(size_t(run_bytes * runs) + 16, 0xAB);
  std::vector<uint8_t> err(size_t(e_run_bytes * runs) + 16, 0xAB);
  kernels().codec_encode(c, block, g.data(), feedback ? e_in.data() : nullptr, e_mul, err.data(), n, runs,
                         out.data());
  for (size_t i = size_t(run_bytes * runs); i < out.size(); ++i)
    if (out[i] != 0xAB) die("codec_encode wrote past its runs");
  for (size_t i = size_t(e_run_bytes * runs); i < err.size(); ++i)
    if (err[i] != 0xAB) die("codec_encode wrote past its residual runs");
  if (feedback) {  // in place: the new residual over the one it starts from
    std::vector<uint8_t> in_place = e_in, out2(out.size());
    kernels().codec_encode(c, block, g.data(), in_place.data(), e_mul, in_place.data(), n, runs, out2.data());
    if (std::memcmp(in_place.data(), err.data(), in_place.size()) != 0 ||
        std::memcmp(out2.data(), out.data(), size_t(run_bytes * runs)) != 0)
      die("encoding over its own residual differs");
  }

  for (int j = 0; j < runs; ++j) {
    for (int64_t b = 0; b * block < n; ++b) {
      const int64_t first = j * n + b * block, len = std::min(block, n - b * block);
      const int64_t e_at = j * e_run_bytes + b * e_record;
      std::vector<float> x(static_cast<size_t>(len));
      for (int64_t i = 0; i < len; ++i) {
        const float residual = feedback ? dsopt::decode_element(BlockCodec::Int8, e_in.data() + e_at, i) : 0.0f;
        const float scaled = residual * e_mul;
        x[size_t(i)] = feedback ? g[size_t(first + i)] + scaled : g[size_t(first + i)];
      }
      std::vector<uint8_t> rec(static_cast<size_t>(record)), one_err(static_cast<size_t>(e_record));
      dsopt::encode_block(c, block, g.data() + first, feedback ? e_in.data() + e_at : nullptr, e_mul, len,
                          rec.data(), one_err.data());
      const uint8_t* got = out.data() + j * run_bytes + b * record;
      if (std::memcmp(got, rec.data(), size_t(record)) != 0) die("the kernel's record differs from encode_block's");
      if (std::memcmp(err.data() + e_at, one_err.data(), size_t(e_record)) != 0)
        die("the kernel's residual differs from encode_block's");
      check_block(c, block, x.data(), len, got, err.data() + e_at);
    }
  }

  std::vector<float> sum(static_cast<size_t>(n));
  kernels().codec_decode_sum(c, block, out.data(), runs, n, sum.data());
  for (int64_t i = 0; i < n; ++i) {
    float want = 0.0f;
    for (int j = 0; j < runs; ++j) {
      const float d = dsopt::decode_element(c, out.data() + j * run_bytes + (i / block) * record, i % block);
      want = j == 0 ? d : want + d;
    }
    if (!same_bits(want, sum[size_t(i)]) && !(std::isnan(want) && std::isnan(sum[size_t(i)])))
      die("decode_sum is not the sum over runs in run order");
  }
  return 0;
}

namespace {

void write_seed(const std::string& dir, const std::string& name, uint8_t codec, uint8_t block,
                uint8_t runs, const std::vector<float>& values) {
  std::vector<uint8_t> bytes = {codec, block, runs};
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  bytes.insert(bytes.end(), p, p + values.size() * 4);
  FILE* f = std::fopen((dir + "/" + name).c_str(), "wb");
  if (!f) die("cannot write a seed");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void write_seeds(const std::string& dir) {
  mkdir(dir.c_str(), 0755);
  std::vector<float> mixed;
  for (int i = 0; i < 96; ++i) mixed.push_back(std::sin(float(i)) * float(1 + i % 7));
  std::vector<float> special = mixed;
  special[3] = NAN;
  special[40] = INFINITY;
  for (int i = 48; i < 64; ++i) special[size_t(i)] = 0.0f;               // an all-zero block
  for (int i = 64; i < 72; ++i) special[size_t(i)] = 1e-41f * float(i);  // denormals
  special[80] = FLT_MAX;
  for (uint8_t codec = 0; codec < 3; ++codec) {
    write_seed(dir, "mixed_" + std::to_string(codec), codec, 1, 0, mixed);
    write_seed(dir, "special_" + std::to_string(codec), codec, 0, 4, special);  // 2 runs, residual
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  setenv("OMP_THREAD_LIMIT", "4", 0);
  setenv("OMP_WAIT_POLICY", "passive", 0);
  write_seeds_if_asked(*argc, *argv, write_seeds);
  return 0;
}
