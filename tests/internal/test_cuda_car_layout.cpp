// The CUDA compressed-allreduce kernels' work split and bit layout, checked
// without a GPU: cuda/car_kernels.cuh is replayed on the host block by
// block, thread by thread and warp by warp (one ballot per 32 threads),
// using the same metadata writer, tensor search, byte addressing and
// ballot-to-byte functions (cuda/car_layout.hpp) and the same element rules
// (math/sign_compress.hpp), then compared bit for bit with the CPU kernels
// for many world sizes and tensor shapes (empty tensors, chunk boundaries
// inside a warp, blocks cut short, -0.0, ties, NaN).
// The kernels themselves run in tests/gpu on machines with a device.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "car_layout.hpp"
#include "kernels/kernels.hpp"
#include "math/sign_compress.hpp"
#include "math/sum_squares.hpp"

using namespace dsopt;
using cuda::CarArgs;
using cuda::CarItem;
using cuda::CarOp;

namespace {

int g_failed = 0, g_passed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
    return;
  }
  ++g_failed;
  std::printf("FAIL %s\n", what.c_str());
}

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t next_u64() {
  g_state ^= g_state >> 12;
  g_state ^= g_state << 25;
  g_state ^= g_state >> 27;
  return g_state * 0x2545F4914F6CDD1Dull;
}
float next_float() {
  const uint64_t r = next_u64();
  switch (r % 16) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return 0.25f;  // ties with the scales below
    case 3: return -0.25f;
  }
  return float(double(int64_t(r >> 11) - (int64_t(1) << 52)) / double(int64_t(1) << 52));
}

bool same_float(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (a != a && b != b);
}
bool same_double(double a, double b) {
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y || (a != a && b != b);
}

int64_t padded_length(int64_t n, int world, bool compact) {
  const int64_t unit = compact ? int64_t(8) * world
                               : int64_t(world) * (int64_t(8) * world / std::gcd(int64_t(world), int64_t(8)));
  return n % unit == 0 ? n : n + unit - n % unit;
}

// ---- one call's launch, as CudaKernels::car_run sets it up -------------------

struct Launch {
  std::vector<unsigned char> meta;
  CarArgs args{};
  int64_t blocks = 0;
};

Launch make_launch(CarOp op, const CarTensor* t, int64_t count, int world, const float* scales,
                   const float* table, int64_t table_len, const uint8_t* in, uint8_t* out,
                   int64_t msg_bytes) {
  Launch l;
  const cuda::CarMetaLayout layout = cuda::car_meta_layout(count, table_len);
  l.meta.resize(layout.bytes + 8);
  l.blocks = cuda::car_write_meta(l.meta.data(), op, t, count, world, scales, table, table_len);
  l.args.items = reinterpret_cast<const CarItem*>(l.meta.data() + layout.items);
  l.args.first = reinterpret_cast<const int64_t*>(l.meta.data() + layout.first);
  l.args.table = reinterpret_cast<const float*>(l.meta.data() + layout.table);
  l.args.count = int32_t(count);
  l.args.world = world;
  l.args.in = in;
  l.args.out = out;
  l.args.msg_bytes = msg_bytes;
  return l;
}

// ---- the kernels, replayed (car_kernels.cuh line by line) ---------------------

struct Block {
  const CarItem* t;
  int tensor;
  int64_t begin, end;
};

Block block_of(const CarArgs& a, int64_t b) {
  Block k;
  k.tensor = cuda::car_find_tensor(a.first, a.count, b);
  k.t = a.items + k.tensor;
  k.begin = (b - a.first[k.tensor]) * kSumBlock;
  k.end = std::min(k.t->len, k.begin + kSumBlock);
  return k;
}

double lane_tree(double* lanes) {
  for (int s = kSumLanes / 2; s >= 1; s >>= 1)
    for (int lane = 0; lane < s; ++lane) lanes[lane] = lanes[lane] + lanes[lane + s];
  return lanes[0];
}

float worker_y(const CarItem& t, int64_t i) { return (i < t.n ? t.x[i] : 0.0f) + t.worker_error[i]; }

// The warp of threads [w*32, w*32+32) stores its ballot as bytes.
template <class ByteAt>
void store_bits(const bool* bit, int64_t base, int w, int64_t end, uint8_t* out, ByteAt byte_at) {
  uint32_t ballot = 0;
  for (int k = 0; k < 32; ++k) ballot |= uint32_t(bit[w * 32 + k]) << k;
  for (int q = 0; q < 4; ++q) {
    const int64_t e = base + w * 32 + 8 * q;
    if (e < end) out[byte_at(e)] = cuda::car_ballot_byte(ballot, q);
  }
}

void replay(CarOp op, const Launch& l, std::vector<double>* block_sums) {
  const CarArgs& a = l.args;
  if (block_sums) block_sums->assign(size_t(l.blocks), 0.0);
  for (int64_t b = 0; b < l.blocks; ++b) {
    const Block k = block_of(a, b);
    const CarItem& t = *k.t;
    double lanes[kSumLanes] = {};
    switch (op) {
      case CarOp::WorkerSumsq:
        for (int j = 0; j < kSumLanes; ++j)
          for (int64_t i = k.begin + j; i < k.end; i += kSumLanes) {
            const float y = worker_y(t, i);
            lanes[j] = lanes[j] + double(y) * double(y);
          }
        (*block_sums)[size_t(b)] = lane_tree(lanes);
        for (int64_t base = k.begin; t.bits && base < k.end; base += kSumLanes) {
          bool bit[kSumLanes] = {};
          for (int j = 0; j < kSumLanes && base + j < k.end; ++j) bit[j] = sign_bit(worker_y(t, base + j)) != 0u;
          for (int w = 0; w < kSumLanes / 32; ++w)
            store_bits(bit, base, w, k.end, t.bits + t.chunk_offset, [](int64_t e) { return e / 8; });
        }
        break;
      case CarOp::WorkerPack:
        for (int64_t base = k.begin; base < k.end; base += kSumLanes) {
          bool bit[kSumLanes] = {};
          for (int j = 0; j < kSumLanes; ++j) {
            const int64_t i = base + j;
            if (i < k.end) {
              const float y = worker_y(t, i);
              t.worker_error[i] = sign_error(y, t.scale);
              bit[j] = sign_bit(y) != 0u;
            }
          }
          for (int w = 0; w < kSumLanes / 32; ++w)
            store_bits(bit, base, w, k.end, a.out,
                       [&](int64_t e) { return cuda::car_send_byte(t, e, a.msg_bytes); });
        }
        break;
      case CarOp::ServerSum: {
        const float* weights = a.table + k.tensor;
        for (int j = 0; j < kSumLanes; ++j)
          for (int64_t i = k.begin + j; i < k.end; i += kSumLanes) {
            float acc = 0.0f;
            const uint8_t* bits = a.in + t.chunk_offset;
            for (int s = 0; s < a.world; ++s, bits += a.msg_bytes) {
              const float w = weights[int64_t(s) * a.count];
              acc = acc + (chunk_bit(bits, i) ? w : -w);
            }
            acc = acc + t.server_error[i];
            t.server_error[i] = acc;
            lanes[j] = lanes[j] + double(acc) * double(acc);
          }
        (*block_sums)[size_t(b)] = lane_tree(lanes);
        break;
      }
      case CarOp::ServerPack:
        for (int64_t base = k.begin; base < k.end; base += kSumLanes) {
          bool bit[kSumLanes] = {};
          for (int j = 0; j < kSumLanes; ++j) {
            const int64_t i = base + j;
            if (i < k.end) {
              const float z = t.server_error[i];
              t.server_error[i] = sign_error(z, t.scale);
              bit[j] = sign_bit(z) != 0u;
            }
          }
          for (int w = 0; w < kSumLanes / 32; ++w)
            store_bits(bit, base, w, k.end, a.out + t.chunk_offset, [](int64_t e) { return e / 8; });
        }
        break;
      case CarOp::Decode: {
        const float* scales = a.table + k.tensor;
        for (int j = 0; j < kSumLanes; ++j) {
          int64_t i = k.begin + j;
          if (i >= k.end) continue;
          int64_t c = t.chunk, q = i / c, chunk_begin = q * c;
          for (; i < k.end; i += kSumLanes) {
            while (i - chunk_begin >= c) {
              ++q;
              chunk_begin += c;
            }
            const float s = scales[q * int64_t(a.count)];
            t.x[i] = chunk_bit(a.in + q * a.msg_bytes + t.chunk_offset, i - chunk_begin) ? s : -s;
          }
        }
        break;
      }
    }
  }
}

// CudaKernels::add_block_sums.
std::vector<double> tensor_sums(const std::vector<double>& block_sums, CarOp op, const CarTensor* t,
                                int64_t count, int world) {
  std::vector<double> sums(static_cast<size_t>(count));
  const double* p = block_sums.data();
  for (int64_t i = 0; i < count; ++i) {
    double s = 0.0;
    for (int64_t k = 0, nb = sum_blocks(cuda::car_len(op, t[i], world)); k < nb; ++k) s += *p++;
    sums[size_t(i)] = s;
  }
  return sums;
}

// ---- one world size and shape list: every primitive, CPU against replay --------

struct State {
  std::vector<CarTensor> t;
  std::vector<std::vector<float>> x, ew, es;
  void bind() {
    for (size_t i = 0; i < t.size(); ++i) {
      t[i].x = x[i].data();
      t[i].worker_error = ew[i].data();
      t[i].server_error = es[i].data();
    }
  }
};

template <class T>
bool same_vectors(const std::vector<std::vector<T>>& a, const std::vector<std::vector<T>>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < a[i].size(); ++k)
      if (!same_float(a[i][k], b[i][k])) return false;
  return true;
}

void run_case(Kernels& cpu, int world, const std::vector<int64_t>& sizes, bool compact, bool nan) {
  const std::string label = "P=" + std::to_string(world) + " tensors=" + std::to_string(sizes.size()) +
                            (compact ? " compact" : "") + (nan ? " nan" : "");
  State s;
  int64_t offset = 0;
  for (int64_t n : sizes) {
    const int64_t padded = padded_length(n, world, compact);
    s.t.push_back(CarTensor{nullptr, n, padded, nullptr, nullptr, offset});
    offset += padded / world / 8;
    std::vector<float> x(size_t(n) + 1), ew(size_t(padded) + 1), es(size_t(padded / world) + 1);
    for (float& v : x) v = next_float();
    for (float& v : ew) v = next_float();
    for (float& v : es) v = next_float();
    if (nan && n > 3) x[3] = NAN;
    s.x.push_back(x);
    s.ew.push_back(ew);
    s.es.push_back(es);
  }
  const int64_t msg_bytes = offset, count = int64_t(sizes.size());
  State r = s;  // the replay's copy
  s.bind();
  r.bind();

  std::vector<float> scales(static_cast<size_t>(count)), table(size_t(count) * size_t(world));
  for (float& v : scales) v = std::fabs(next_float()) + 0.25f;
  for (float& v : table) v = next_float();
  scales[0] = 0.25f;
  std::vector<uint8_t> in(size_t(msg_bytes) * size_t(world) + 1);
  for (uint8_t& v : in) v = uint8_t(next_u64());

  // W1/W2
  {
    std::vector<double> a(static_cast<size_t>(count)), bs;
    cpu.car_worker_sumsq(s.t.data(), count, a.data());
    const Launch l = make_launch(CarOp::WorkerSumsq, r.t.data(), count, world, nullptr, nullptr, 0,
                                 nullptr, nullptr, 0);
    replay(CarOp::WorkerSumsq, l, &bs);
    const std::vector<double> b = tensor_sums(bs, CarOp::WorkerSumsq, r.t.data(), count, world);
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) ok &= same_double(a[size_t(i)], b[size_t(i)]);
    check(ok, label + ": worker sums of squares");
  }
  // W1/W2 with W4/W5: the signs of each tensor's n' elements at bits +
  // chunk_offset (tensors back to back), as the CPU writes them.
  {
    std::vector<CarTensor> st = s.t, rt = r.t;
    int64_t at = 0;
    for (size_t i = 0; i < st.size(); ++i) {
      st[i].chunk_offset = rt[i].chunk_offset = at;
      at += st[i].padded / 8;
    }
    std::vector<uint8_t> a(size_t(at) + 1, 0xA5), b = a;
    for (size_t i = 0; i < st.size(); ++i) {
      st[i].bits = a.data();
      rt[i].bits = b.data();
    }
    std::vector<double> sa(static_cast<size_t>(count)), bs;
    cpu.car_worker_sumsq(st.data(), count, sa.data());
    const Launch l = make_launch(CarOp::WorkerSumsq, rt.data(), count, world, nullptr, nullptr, 0,
                                 nullptr, nullptr, 0);
    replay(CarOp::WorkerSumsq, l, &bs);
    const std::vector<double> sb = tensor_sums(bs, CarOp::WorkerSumsq, rt.data(), count, world);
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) ok &= same_double(sa[size_t(i)], sb[size_t(i)]);
    check(ok, label + ": worker sums of squares with signs");
    check(a == b, label + ": worker sign bytes of the sums");
  }
  // W3-W6
  {
    std::vector<uint8_t> a(size_t(msg_bytes) * size_t(world) + 1, 0xA5), b = a;
    cpu.car_worker_pack(s.t.data(), count, world, scales.data(), a.data(), msg_bytes);
    const Launch l = make_launch(CarOp::WorkerPack, r.t.data(), count, world, scales.data(), nullptr,
                                 0, nullptr, b.data(), msg_bytes);
    replay(CarOp::WorkerPack, l, nullptr);
    check(a == b, label + ": worker sign bytes");
    check(same_vectors(s.ew, r.ew), label + ": worker errors");
  }
  // S1/S2
  {
    std::vector<double> a(static_cast<size_t>(count)), bs;
    cpu.car_server_sum(s.t.data(), count, world, in.data(), msg_bytes, table.data(), a.data());
    const Launch l = make_launch(CarOp::ServerSum, r.t.data(), count, world, nullptr, table.data(),
                                 int64_t(table.size()), in.data(), nullptr, msg_bytes);
    replay(CarOp::ServerSum, l, &bs);
    const std::vector<double> b = tensor_sums(bs, CarOp::ServerSum, r.t.data(), count, world);
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) ok &= same_double(a[size_t(i)], b[size_t(i)]);
    check(ok, label + ": server sums of squares");
    check(same_vectors(s.es, r.es), label + ": server sums (e_s)");
  }
  // S4/S5
  {
    std::vector<uint8_t> a(size_t(msg_bytes) + 1, 0x5A), b = a;
    cpu.car_server_pack(s.t.data(), count, world, scales.data(), a.data());
    const Launch l = make_launch(CarOp::ServerPack, r.t.data(), count, world, scales.data(), nullptr,
                                 0, nullptr, b.data(), 0);
    replay(CarOp::ServerPack, l, nullptr);
    check(a == b, label + ": server sign bytes");
    check(same_vectors(s.es, r.es), label + ": server errors");
  }
  // F1/F2
  {
    cpu.car_decode(s.t.data(), count, world, in.data(), msg_bytes, table.data());
    const Launch l = make_launch(CarOp::Decode, r.t.data(), count, world, nullptr, table.data(),
                                 int64_t(table.size()), in.data(), nullptr, msg_bytes);
    replay(CarOp::Decode, l, nullptr);
    check(same_vectors(s.x, r.x), label + ": decoded values (and x[n] untouched)");
  }
}

void ballot_bytes_are_msb_first() {
  // Signs [+,-,-,-,-,-,-,+] -> 0x81 (docs/design/compressed-allreduce.md section 5).
  check(cuda::car_ballot_byte(0x81u, 0) == 0x81, "ballot byte 0");
  check(cuda::car_ballot_byte(0x01u << 8, 1) == 0x80, "ballot byte 1: element 8 is the MSB");
  check(cuda::car_ballot_byte(0x80000000u, 3) == 0x01, "ballot byte 3: element 31 is the LSB");
  check(cuda::car_ballot_byte(0x00000006u, 0) == 0x60, "elements 1 and 2");
}

void tensor_search() {
  const int64_t first[] = {0, 0, 3, 3, 3, 7, 7};  // tensors 0, 3, 4 and 6 are empty
  const int expect[] = {1, 1, 1, 4, 4, 4, 4};
  bool ok = true;
  for (int64_t b = 0; b < 7; ++b) ok &= cuda::car_find_tensor(first, 6, b) == expect[b];
  check(ok, "tensor search skips empty tensors");
}

}  // namespace

int main() {
  std::unique_ptr<Kernels> cpu = make_cpu_kernels(2);
  ballot_bytes_are_msb_first();
  tensor_search();
  for (int world : {1, 2, 3, 4, 5, 8, 16}) {
    run_case(*cpu, world, {1000}, false, false);
    run_case(*cpu, world, {0, 1, 7, 8, 100, 0, 4095, 4096, 4097, 12289, 70001, 0}, false, false);
    run_case(*cpu, world, {5, 333, 9000, 4096 * 3 + 40}, true, false);
    run_case(*cpu, world, {17, 20000}, false, true);
  }
  run_case(*cpu, 3, {4096 * 3 * 8 + 1}, true, false);
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
