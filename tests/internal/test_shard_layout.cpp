// ZeRO's shard layout (src/zero/shard_layout.hpp) on random parameter
// sizes, world sizes and bucket sizes, against the properties every other
// part relies on: every parameter element is owned by exactly one rank at
// exactly one shard offset; the shard offset of a flat element follows the
// bucket rule (bucket k's piece r at the bucket's shard offset); shards have
// the same length S = n'/P, with n' the smallest multiple of 2P >= n; a
// cut range [begin, end) of a shard holds exactly the fragments inside it.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "zero/shard_layout.hpp"

using dsopt::ShardFragment;
using dsopt::ShardLayout;

namespace {

int failures = 0, cases = 0;

void check(bool ok, const char* what, int world, int64_t bucket) {
  if (!ok && ++failures <= 10) std::printf("FAIL %s (P=%d, bucket %lld)\n", what, world, (long long)bucket);
}

void check_layout(const std::vector<int64_t>& numels, int world, int64_t bucket_elems) {
  ++cases;
  const ShardLayout layout(numels, world, bucket_elems);
  int64_t n = 0;
  std::vector<int64_t> start;
  for (int64_t k : numels) {
    start.push_back(n);
    n += k;
  }
  const int64_t padded = (n + 2 * world - 1) / (2 * world) * (2 * world);
  check(layout.flat_numel() == n && layout.padded_numel() == padded, "padded length", world, bucket_elems);
  check(layout.shard_numel() * world == padded, "shard length", world, bucket_elems);
  const int64_t b = layout.bucket_elems();
  check(b % (2 * world) == 0 && b >= 2 * world && (bucket_elems < 2 * world || b <= bucket_elems),
        "bucket size rule", world, bucket_elems);

  // Owner and shard offset of every flat element, from the rule directly.
  std::vector<int> owner(size_t(n), -1);
  std::vector<int64_t> at(size_t(n), -1);
  for (int64_t k0 = 0; k0 < padded; k0 += b) {
    const int64_t len = std::min(b, padded - k0), piece = len / world;
    for (int64_t x = k0; x < k0 + len && x < n; ++x) {
      owner[size_t(x)] = int((x - k0) / piece);
      at[size_t(x)] = k0 / world + (x - k0) % piece;
    }
  }
  std::vector<int> seen(size_t(n), 0);
  for (int r = 0; r < world; ++r) {
    int64_t prev_end = 0;
    for (const ShardFragment& f : layout.fragments(r)) {
      check(f.numel > 0 && f.param_offset >= 0 && f.param_offset + f.numel <= numels[size_t(f.param)],
            "fragment inside its parameter", world, bucket_elems);
      check(f.shard_offset >= prev_end && f.shard_offset + f.numel <= layout.shard_numel(),
            "fragments in shard order, inside the shard", world, bucket_elems);
      prev_end = f.shard_offset + f.numel;
      for (int64_t i = 0; i < f.numel; ++i) {
        const int64_t x = start[size_t(f.param)] + f.param_offset + i;
        ++seen[size_t(x)];
        check(owner[size_t(x)] == r && at[size_t(x)] == f.shard_offset + i, "owner and offset", world,
              bucket_elems);
      }
    }
    // A cut range holds the same elements as the whole list restricted to it.
    const int64_t s = layout.shard_numel(), lo = s / 3, hi = s - s / 4;
    int64_t whole = 0, cut = 0;
    for (const ShardFragment& f : layout.fragments(r))
      whole += std::max<int64_t>(0, std::min(hi, f.shard_offset + f.numel) - std::max(lo, f.shard_offset));
    for (const ShardFragment& f : layout.fragments(r, lo, hi)) {
      check(f.shard_offset >= lo && f.shard_offset + f.numel <= hi, "cut fragments inside the range",
            world, bucket_elems);
      cut += f.numel;
    }
    check(whole == cut, "cut range holds the same elements", world, bucket_elems);
  }
  for (int64_t x = 0; x < n; ++x)
    if (seen[size_t(x)] != 1) {
      check(false, "every element owned exactly once", world, bucket_elems);
      break;
    }
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261124);
  for (int trial = 0; trial < 400; ++trial) {
    const int count = 1 + int(rng() % 7);
    std::vector<int64_t> numels;
    for (int i = 0; i < count; ++i) numels.push_back(1 + int64_t(rng() % (trial % 2 ? 7 : 300)));
    const int world = 1 + int(rng() % 6);
    const int64_t bucket = int64_t(1 + rng() % 200);
    check_layout(numels, world, bucket);
    check_layout(numels, world, int64_t(1) << 40);  // one bucket: contiguous shards
  }
  std::printf("%d layouts, %d failures\n", cases, failures);
  return failures ? 1 : 0;
}
