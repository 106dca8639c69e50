// FNV-1a over bytes, for the fingerprints that ranks compare (parameters,
// gradients, where a rank runs). Fingerprints are compared only with ones
// made by the same code, never stored across versions except through the
// run id, so the offset basis is fixed as it has always been here.
#pragma once
#include <cstddef>
#include <cstdint>

namespace dsopt {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;

inline uint64_t fnv1a(const void* data, size_t n, uint64_t h = kFnvOffset) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace dsopt
