#include "optim/gather_order.hpp"

#include <algorithm>

namespace dsopt {

std::string GatherOrder::check(const int64_t* order, int64_t count, int64_t params) {
  if (count == 0) return "";
  if (count < 0) return "count " + std::to_string(count) + " is negative";
  if (!order) return "param_order is NULL with count " + std::to_string(count);
  if (count != params)
    return "count " + std::to_string(count) + " is not the number of parameters (" +
           std::to_string(params) + "); the order lists every parameter once";
  std::vector<uint8_t> seen(size_t(params), 0);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t i = order[k];
    if (i < 0 || i >= params)
      return "param_order[" + std::to_string(k) + "] = " + std::to_string(i) +
             " is not a parameter index (0 .. " + std::to_string(params - 1) + ")";
    if (seen[size_t(i)])
      return "param_order[" + std::to_string(k) + "] = " + std::to_string(i) +
             " repeats a parameter; the order lists every parameter once";
    seen[size_t(i)] = 1;
  }
  return "";
}

namespace {
bool identity(const int64_t* order, int64_t count) {
  for (int64_t k = 0; k < count; ++k)
    if (order[k] != k) return false;
  return true;
}
}  // namespace

uint64_t GatherOrder::fingerprint(const int64_t* order, int64_t count, int64_t params) {
  // FNV-1a over the indices (the default: 0 .. params-1), then splitmix64's
  // final mix.
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t k = 0; k < params; ++k) {
    uint64_t v = uint64_t(count == 0 ? k : order[k]);
    for (int b = 0; b < 8; ++b, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

void GatherOrder::set(const int64_t* order, int64_t count, int64_t chunks,
                      const std::function<std::vector<int64_t>(int64_t)>& chunks_of) {
  std::vector<int64_t> sequence, position;
  if (count > 0 && chunks > 0 && !identity(order, count)) {
    position.assign(size_t(chunks), -1);
    const auto place = [&](int64_t c) {
      if (position[size_t(c)] >= 0) return;
      position[size_t(c)] = int64_t(sequence.size());
      sequence.push_back(c);
    };
    for (int64_t k = 0; k < count; ++k)
      for (int64_t c : chunks_of(order[k])) place(c);
    for (int64_t c = 0; c < chunks; ++c) place(c);  // chunks of padding only
  }
  sequence_ = std::move(sequence);
  position_ = std::move(position);
}

int64_t GatherOrder::last_position(const std::vector<int64_t>& chunks) const {
  int64_t last = -1;
  for (int64_t c : chunks) last = std::max(last, position_.empty() ? c : position_[size_t(c)]);
  return last;
}

}  // namespace dsopt
