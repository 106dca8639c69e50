// libFuzzer target: untrusted state blobs into dsopt_state_load and
// dsopt_state_load_shards, for every algorithm.
//
// Input: one selector byte, then the payload.
//   selector bits 0-2: algorithm: Adam (L2), AdamW, OneBitAdam, OneBitLamb,
//                      ZeroOneAdam, AdamW with ZeRO stage 2, Lamb, Lamb with
//                      ZeRO stage 2
//   bit 3: parameters: 0 = fp32, fp16 and bf16 tensors in two groups with
//          dynamic fp16 loss scaling; 1 = one fp32 tensor, one group, clipping
//   bit 4: steps taken before the blob under test is loaded: 0 = 1 (1-bit
//          warmup), 1 = 5 (1-bit compression / 0/1 Adam's local phase)
//   bits 5 and 6 both set: raw mode, the payload is passed as it is;
//          otherwise every blob gets its total size and CRC-32 fixed up
//          first, so that mutations reach the checks behind the checksum.
// The payload goes to dsopt_state_load, to dsopt_state_load_shards as one
// blob, and to dsopt_state_load_shards split into two blobs (at the total
// size the first blob states, else in the middle).
//
// Properties (abort() when one fails, so libFuzzer reports it):
//  - a rejected load returns DSOPT_ECORRUPT or DSOPT_EMISMATCH with a
//    message, and leaves the parameters and a fresh dsopt_state_save byte
//    for byte as they were;
//  - an accepted load leaves a state that saves, reloads and saves again to
//    the same bytes, and dsopt_step then returns DSOPT_OK or
//    DSOPT_ENONFINITE.
// One optimizer per (algorithm, parameters, steps) lives for the whole run;
// after an accepted load it is put back by loading its baseline blob.
//
//   fuzz_state_load --write-seeds DIR   writes the seed corpus and exits.
//   DSOPT_FUZZ_VERBOSE=1 fuzz_state_load FILE...   prints every load's status.
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/compressed_allreduce.hpp"
#include "dsopt.h"
#include "fuzz_seeds.hpp"
#include "math/half.hpp"
#include "state/blob.hpp"
#include "zero/moment_shards.hpp"
#include "zero/shard_layout.hpp"

namespace {

using Bytes = std::vector<uint8_t>;
using dsopt::BlobParam;

constexpr int kAlgorithms = 8;
const char* const kAlgName[kAlgorithms] = {"adam",          "adamw",       "onebit_adam", "onebit_lamb",
                                           "zero_one_adam", "adamw_zero2", "lamb",        "lamb_zero2"};
// The ZeRO-2 algorithm of a stage-0 one and back (-1: none), and the blob
// prefix of their moments.
int zero_of(int alg) { return alg == 1 ? 5 : alg == 6 ? 7 : -1; }
int stage0_of(int alg) { return alg == 5 ? 1 : alg == 7 ? 6 : -1; }
const char* moments_of(int alg) { return alg >= 6 ? "lamb" : "adam"; }
constexpr int64_t kZeroBucket = 8;  // reduce_bucket_size of the ZeRO optimizer

[[noreturn]] void die(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_state_load: PROPERTY VIOLATED: %s %s\n", what, detail);
  std::abort();
}

std::string config_of(int alg, bool fp32_only) {
  std::string opt;
  switch (alg) {
    case 0:
      opt = R"("optimizer": {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.01, "adam_w_mode": false}})";
      break;
    case 1:
      opt = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}})";
      break;
    case 2:
      opt = R"("optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 3}})";
      break;
    case 3:
      opt = R"("optimizer": {"type": "OneBitLamb", "params": {"lr": 0.01, "freeze_step": 3, "weight_decay": 0.01}})";
      break;
    case 4:
      opt = R"("optimizer": {"type": "ZeroOneAdam", "params": {"lr": 0.01, "var_freeze_step": 3, )"
            R"("var_update_scaler": 1, "local_step_scaler": 1, "local_step_clipper": 4}})";
      break;
    case 5:
      opt = R"("optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, )"
            R"("zero_optimization": {"stage": 2, "reduce_bucket_size": 8, "allgather_bucket_size": 6})";
      break;
    case 6:
      opt = R"("optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}})";
      break;
    default:
      opt = R"("optimizer": {"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.01}}, )"
            R"("zero_optimization": {"stage": 2, "reduce_bucket_size": 8, "allgather_bucket_size": 6})";
      break;
  }
  std::string c = "{" + opt + R"(, "threads": 1)";
  if (fp32_only) {
    c += R"(, "gradient_clipping": 1.0})";
  } else {
    c += std::string(R"(, "param_groups": [{"lr": 0.02)") + (alg == 2 ? R"(, "non_freeze": true)" : "") +
         R"(}, {"betas": [0.8, 0.99], "eps": 1e-4}])"
         R"(, "fp16": {"enabled": true, "initial_scale_power": 3, "loss_scale_window": 2, "hysteresis": 1}})";
  }
  return c;
}

struct Spec {
  int64_t numel;
  int32_t dtype, group;
};
const Spec kMixed[] = {{5, DSOPT_FLOAT32, 0}, {7, DSOPT_FLOAT16, 1}, {3, DSOPT_BFLOAT16, 1}};
const Spec kFp32[] = {{9, DSOPT_FLOAT32, 0}};

size_t dtype_bytes(int32_t d) { return d == DSOPT_FLOAT32 ? 4 : 2; }

// One live optimizer and what it looked like before the blob under test.
struct Live {
  dsopt_comm* comm = nullptr;
  dsopt_optimizer* opt = nullptr;
  std::vector<Bytes> param_bufs;
  std::vector<std::vector<float>> grad_bufs;
  std::vector<dsopt_tensor> params, grads;
  std::vector<BlobParam> shapes;
  Bytes baseline;                     // dsopt_state_save before the load
  std::vector<Bytes> baseline_params;
  int steps_taken = 0;
};

Bytes save(dsopt_optimizer* opt) {
  uint64_t n = 0;
  if (dsopt_state_size(opt, &n) != DSOPT_OK) die("dsopt_state_size failed:", dsopt_last_error());
  Bytes b(static_cast<size_t>(n));
  uint64_t written = 0;
  const int rc = dsopt_state_save(opt, b.data(), n, &written);
  if (rc != DSOPT_OK) die("dsopt_state_save failed:", dsopt_last_error());
  if (written != n) die("dsopt_state_save wrote another size than dsopt_state_size");
  return b;
}

void fill_grads(Live& L, int k, bool overflow) {
  for (size_t t = 0; t < L.grad_bufs.size(); ++t)
    for (size_t i = 0; i < L.grad_bufs[t].size(); ++i)
      L.grad_bufs[t][i] = float(0.5 * std::sin(0.7 * double(i) + 1.3 * double(k) + double(t)));
  if (overflow) L.grad_bufs[0][0] = INFINITY;
}

int step(Live& L, int k, bool overflow = false) {
  fill_grads(L, k, overflow);
  dsopt_step_info info;
  std::memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  return dsopt_step(L.opt, L.grads.data(), int64_t(L.grads.size()), &info);
}

Live* make_live(int alg, bool fp32_only, bool late) {
  auto* L = new Live;
  if (dsopt_comm_create_local(&L->comm) != DSOPT_OK) die("dsopt_comm_create_local failed");
  const Spec* specs = fp32_only ? kFp32 : kMixed;
  const size_t n = fp32_only ? 1 : 3;
  L->param_bufs.resize(n);
  L->grad_bufs.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const Spec& s = specs[t];
    L->param_bufs[t].resize(size_t(s.numel) * dtype_bytes(s.dtype));
    for (int64_t i = 0; i < s.numel; ++i) {
      const float v = float(0.25 * std::cos(1.1 * double(i) + double(t)));
      uint8_t* p = L->param_bufs[t].data() + size_t(i) * dtype_bytes(s.dtype);
      if (s.dtype == DSOPT_FLOAT32) std::memcpy(p, &v, 4);
      else {
        const uint16_t h = s.dtype == DSOPT_FLOAT16 ? dsopt::float_to_f16(v) : dsopt::float_to_bf16(v);
        std::memcpy(p, &h, 2);
      }
    }
    L->grad_bufs[t].assign(size_t(s.numel), 0.0f);
    L->params.push_back(dsopt_tensor{L->param_bufs[t].data(), s.numel, s.dtype, s.group});
    L->grads.push_back(dsopt_tensor{L->grad_bufs[t].data(), s.numel, DSOPT_FLOAT32, 0});
    L->shapes.push_back(dsopt::BlobParam{s.numel, s.dtype, s.group});
  }
  const std::string cfg = config_of(alg, fp32_only);
  if (dsopt_create(&L->opt, cfg.c_str(), L->comm, L->params.data(), int64_t(n)) != DSOPT_OK)
    die("dsopt_create failed:", dsopt_last_error());
  const int steps = late ? 5 : 1;
  for (int k = 0; k < steps; ++k) {
    // One overflowing step on the way with fp16 loss scaling (not the last).
    const int rc = step(*L, k, !fp32_only && k == 1 && steps > 2);
    if (rc != DSOPT_OK) die("pre-step failed:", dsopt_last_error());
  }
  L->steps_taken = steps;
  L->baseline = save(L->opt);
  L->baseline_params = L->param_bufs;
  return L;
}

Live* live_for(int alg, bool fp32_only, bool late) {
  static Live* cache[kAlgorithms][2][2];
  Live*& slot = cache[alg][fp32_only][late];
  if (!slot) slot = make_live(alg, fp32_only, late);
  return slot;
}

// Total size and CRC-32 as a well-formed blob of this length would have.
void fix_up(Bytes& b) {
  if (b.size() < 28) return;
  const uint64_t total = b.size();
  std::memcpy(b.data() + 16, &total, 8);
  const uint32_t crc = uint32_t(crc32_z(crc32_z(0L, Z_NULL, 0), b.data(), b.size() - 4));
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
}

// A non-null pointer for every blob, empty ones included (NULL is EINVAL).
const void* ptr(const Bytes& b) {
  static const uint8_t empty = 0;
  return b.empty() ? &empty : b.data();
}

bool unchanged(const Live& L) { return L.param_bufs == L.baseline_params && save(L.opt) == L.baseline; }

void after_load(Live& L, int rc, const char* call) {
  static const bool verbose = std::getenv("DSOPT_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  %s: %s %s\n", call, dsopt_status_string(rc), dsopt_last_error());
  if (rc != DSOPT_OK) {
    if (rc != DSOPT_ECORRUPT && rc != DSOPT_EMISMATCH) {
      std::fprintf(stderr, "%s returned %d (%s): %s\n", call, rc, dsopt_status_string(rc),
                   dsopt_last_error());
      die("a load of a non-null blob returned neither DSOPT_ECORRUPT nor DSOPT_EMISMATCH");
    }
    if (dsopt_last_error()[0] == '\0') die("a rejected load left no message:", call);
    if (!unchanged(L)) die("a rejected load changed the parameters or the state:", call);
    return;
  }
  // Accepted: the state saves and reloads to the same bytes...
  const Bytes b1 = save(L.opt);
  if (dsopt_state_load(L.opt, b1.data(), b1.size()) != DSOPT_OK)
    die("the state an accepted load left does not reload:", dsopt_last_error());
  if (save(L.opt) != b1) die("save, load, save of an accepted state differ:", call);
  // ...and the optimizer still steps.
  for (int k = 0; k < 2; ++k) {
    const int s = step(L, L.steps_taken + k);
    if (s != DSOPT_OK && s != DSOPT_ENONFINITE) {
      std::fprintf(stderr, "dsopt_step returned %d (%s): %s\n", s, dsopt_status_string(s),
                   dsopt_last_error());
      die("dsopt_step after an accepted load failed:", call);
    }
  }
  // Back to the baseline for the next load.
  L.param_bufs = L.baseline_params;  // same sizes: the buffers stay where they are
  if (dsopt_state_load(L.opt, L.baseline.data(), L.baseline.size()) != DSOPT_OK)
    die("the baseline blob does not load:", dsopt_last_error());
  if (!unchanged(L)) die("loading the baseline blob did not restore the baseline");
}

// ---- seed corpus ---------------------------------------------------------------

// A blob taken apart and put together again (trusted input: our own saves).
struct RawBlob {
  std::string algorithm;
  uint32_t world = 1, rank = 0;
  std::vector<BlobParam> params;
  std::vector<std::pair<std::string, Bytes>> sections;

  Bytes& section(const std::string& name) {
    for (auto& s : sections)
      if (s.first == name) return s.second;
    die("seed: no section", name.c_str());
  }
  bool has(const std::string& name) const {
    for (auto& s : sections)
      if (s.first == name) return true;
    return false;
  }
};

struct Reader {
  const Bytes& b;
  size_t pos = 0;
  template <class T>
  T get() {
    if (pos + sizeof(T) > b.size()) die("seed: blob too short");
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str() {
    const uint32_t n = get<uint32_t>();
    std::string s(reinterpret_cast<const char*>(b.data() + pos), n);
    pos += n;
    return s;
  }
};

RawBlob parse(const Bytes& b) {
  Reader r{b};
  r.pos = 24;
  RawBlob out;
  out.algorithm = r.str();
  out.world = r.get<uint32_t>();
  out.rank = r.get<uint32_t>();
  const uint64_t np = r.get<uint64_t>();
  for (uint64_t i = 0; i < np; ++i) {
    BlobParam p;
    p.numel = r.get<int64_t>();
    p.dtype = r.get<int32_t>();
    p.group = r.get<int32_t>();
    out.params.push_back(p);
  }
  const uint32_t ns = r.get<uint32_t>();
  for (uint32_t i = 0; i < ns; ++i) {
    std::string name = r.str();
    const uint64_t n = r.get<uint64_t>();
    out.sections.emplace_back(name, Bytes(b.begin() + long(r.pos), b.begin() + long(r.pos + n)));
    r.pos += n;
  }
  return out;
}

struct Out {
  Bytes b;
  template <class T>
  void put(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put(uint32_t(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  }
};

Bytes serialize(const RawBlob& r) {
  Out o;
  const char magic[8] = {'D', 'S', 'O', 'P', 'T', 'S', 'T', '\0'};
  o.b.insert(o.b.end(), magic, magic + 8);
  o.put(uint32_t(1));
  o.put(uint32_t(0));
  o.put(uint64_t(0));
  o.str(r.algorithm);
  o.put(r.world);
  o.put(r.rank);
  o.put(uint64_t(r.params.size()));
  for (const BlobParam& p : r.params) {
    o.put(p.numel);
    o.put(p.dtype);
    o.put(p.group);
  }
  o.put(uint32_t(r.sections.size()));
  for (const auto& s : r.sections) {
    o.str(s.first);
    o.put(uint64_t(s.second.size()));
    o.b.insert(o.b.end(), s.second.begin(), s.second.end());
  }
  o.put(uint32_t(0));
  fix_up(o.b);
  return o.b;
}

template <class T>
Bytes bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  return Bytes(p, p + v.size() * sizeof(T));
}

Bytes pattern(uint64_t nbytes, float base) {
  std::vector<float> f(size_t(nbytes / 4));
  for (size_t i = 0; i < f.size(); ++i) f[i] = base * float(int(i % 7) - 3);
  return bytes_of(f);
}

// The blob of rank `rank` of a `world`-rank run of the same state: the
// replicated state as it is, rank-local sections (compression errors, 1-bit
// LAMB's padding tail) sized for `world`.
Bytes as_rank_of(const Bytes& blob, uint32_t world, uint32_t rank, const std::vector<BlobParam>& shapes) {
  RawBlob r = parse(blob);
  r.world = world;
  r.rank = rank;
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (const BlobParam& p : shapes) {
    sizes.push_back(p.numel);
    total += p.numel;
  }
  const auto errors = [&](const std::string& prefix, const std::vector<int64_t>& which) {
    uint64_t worker = 0;
    for (int64_t n : which) worker += uint64_t(dsopt::CompressedAllreduce::padded_length(n, int(world))) * 4;
    r.section(prefix + ".worker_error") = pattern(worker, 0.001f * float(rank + 1));
    r.section(prefix + ".server_error") = pattern(worker / world, 0.002f);
  };
  if (r.has("onebit.stage")) {
    Bytes& st = r.section("onebit.stage");
    int32_t compressing;
    std::memcpy(&compressing, st.data(), 4);
    if (compressing) {
      std::memcpy(st.data() + 12, &world, 4);
      // Compressed tensors: those of groups without non_freeze (in these
      // seeds group 0 is non_freeze when there are two groups).
      std::vector<int64_t> compressed;
      for (const BlobParam& p : shapes)
        if (!(shapes.size() > 1 && p.group == 0)) compressed.push_back(p.numel);
      errors("onebit", compressed);
    }
  } else if (r.has("lamb.stage")) {
    Bytes& st = r.section("lamb.stage");
    int32_t compressing;
    std::memcpy(&compressing, st.data(), 4);
    if (compressing) {
      std::memcpy(st.data() + 20, &world, 4);
      const int64_t padded = dsopt::CompressedAllreduce::padded_length(total, int(world));
      r.section("lamb.momentum_tail") = pattern(uint64_t(padded - total) * 4, 0.01f);
      r.section("lamb.worker_error") = pattern(uint64_t(padded) * 4, 0.001f * float(rank + 1));
      r.section("lamb.server_error") = pattern(uint64_t(padded / world) * 4, 0.002f);
    }
  } else if (r.has("zoadam.schedule")) {
    Bytes& st = r.section("zoadam.schedule");
    std::memcpy(st.data() + 44, &world, 4);
    errors("zoadam", sizes);
  }
  return serialize(r);
}

// The ZeRO-2 shards of rank 0 and 1 of a 2-rank run of the state in `blob`
// (a one-rank ZeRO blob), cut with the library's own layout code.
std::vector<Bytes> zero_shards(const Bytes& blob, const std::vector<BlobParam>& shapes,
                               const std::string& prefix) {
  auto reader = std::make_shared<const dsopt::BlobReader>(blob.data(), blob.size());
  std::vector<int64_t> numels;
  for (const BlobParam& p : shapes) numels.push_back(p.numel);
  const dsopt::ShardLayout layout(numels, 2, kZeroBucket);
  std::vector<Bytes> out;
  for (int rank = 0; rank < 2; ++rank) {
    const dsopt::StateLayout target = dsopt::sharded_state_layout(layout, rank, shapes);
    const dsopt::HostMomentState s = dsopt::assemble_moment_state({reader}, shapes, target, prefix);
    RawBlob r = parse(blob);
    r.world = 2;
    r.rank = uint32_t(rank);
    dsopt::ZeroLayoutRecord rec{2, 2, uint32_t(rank), layout.bucket_elems(), layout.shard_numel(),
                                target.master_numel};
    r.section(dsopt::kZeroLayoutSection) = dsopt::encode(rec);
    r.section(dsopt::kZeroMastersSection) = bytes_of(s.masters);
    r.section(prefix + ".exp_avg") = bytes_of(s.m);
    r.section(prefix + ".exp_avg_sq") = bytes_of(s.v);
    out.push_back(serialize(r));
  }
  return out;
}

void write_file(const std::string& dir, const std::string& name, uint8_t selector,
                const std::vector<Bytes>& blobs) {
  Bytes data{selector};
  for (const Bytes& b : blobs) data.insert(data.end(), b.begin(), b.end());
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(data.data(), 1, data.size(), f) != data.size() || std::fclose(f) != 0)
    die("cannot write", path.c_str());
}

void write_seeds(const std::string& dir) {
  mkdir(dir.c_str(), 0755);
  int files = 0;
  for (int alg = 0; alg < kAlgorithms; ++alg)
    for (int fp32 = 0; fp32 < 2; ++fp32)
      for (int late = 0; late < 2; ++late) {
        Live& L = *live_for(alg, fp32, late);
        const uint8_t sel = uint8_t(alg | fp32 << 3 | late << 4);
        const std::string stem = std::string(kAlgName[alg]) + (fp32 ? "_fp32" : "_mixed") +
                                 (late ? "_late" : "_early");
        write_file(dir, stem + ".blob", sel, {L.baseline});
        ++files;
        if (!late) continue;
        // A set of two ranks' blobs, and one blob of another world size.
        if (const int stage0 = stage0_of(alg); stage0 >= 0) {
          const std::vector<Bytes> shards = zero_shards(L.baseline, L.shapes, moments_of(alg));
          write_file(dir, stem + "_zero2_shards.blobs", sel, shards);
          // The same shards into the stage-0 optimizer (stage 2 -> 0).
          write_file(dir, std::string(kAlgName[stage0]) + (fp32 ? "_fp32" : "_mixed") + "_late_from_zero2.blobs",
                     uint8_t(stage0 | fp32 << 3 | late << 4), shards);
          files += 2;
        } else {
          const Bytes r0 = as_rank_of(L.baseline, 2, 0, L.shapes);
          const Bytes r1 = as_rank_of(L.baseline, 2, 1, L.shapes);
          write_file(dir, stem + "_world2.blobs", sel, {r0, r1});
          write_file(dir, stem + "_world2_rank1.blob", sel, {r1});
          files += 2;
          if (const int zero = zero_of(alg); zero >= 0) {  // stage 0 -> 2
            write_file(dir, std::string(kAlgName[zero]) + (fp32 ? "_fp32" : "_mixed") + "_late_from_stage0.blobs",
                       uint8_t(zero | fp32 << 3 | late << 4), {r0, r1});
            ++files;
          }
        }
        if (!fp32) {  // raw mode: the checksum and size checks themselves
          write_file(dir, stem + "_raw.blob", uint8_t(sel | 0x60), {L.baseline});
          ++files;
        }
      }
  std::fprintf(stderr, "fuzz_state_load: wrote %d seeds to %s\n", files, dir.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Kernels run on one thread ("threads": 1); keep OpenMP from spinning.
  setenv("OMP_WAIT_POLICY", "passive", 0);
  write_seeds_if_asked(*argc, *argv, write_seeds);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t sel = data[0];
  const int alg = (sel & 7) % kAlgorithms;
  const bool fp32_only = sel & 8, late = sel & 16, raw = (sel & 0x60) == 0x60;
  Live& L = *live_for(alg, fp32_only, late);
  const Bytes payload(data + 1, data + size);

  // 1. dsopt_state_load
  {
    Bytes b = payload;
    if (!raw) fix_up(b);
    after_load(L, dsopt_state_load(L.opt, ptr(b), b.size()), "dsopt_state_load");
  }
  // 2. dsopt_state_load_shards, one blob
  {
    Bytes b = payload;
    if (!raw) fix_up(b);
    const void* blobs[1] = {ptr(b)};
    const uint64_t sizes[1] = {b.size()};
    after_load(L, dsopt_state_load_shards(L.opt, blobs, sizes, 1), "dsopt_state_load_shards(1)");
  }
  // 3. dsopt_state_load_shards, two blobs
  {
    uint64_t k = 0;
    if (payload.size() >= 24) std::memcpy(&k, payload.data() + 16, 8);
    if (k == 0 || k >= payload.size()) k = payload.size() / 2;
    Bytes a(payload.begin(), payload.begin() + long(k)), b(payload.begin() + long(k), payload.end());
    if (!raw) {
      fix_up(a);
      fix_up(b);
    }
    const void* blobs[2] = {ptr(a), ptr(b)};
    const uint64_t sizes[2] = {a.size(), b.size()};
    after_load(L, dsopt_state_load_shards(L.opt, blobs, sizes, 2), "dsopt_state_load_shards(2)");
  }
  return 0;
}
