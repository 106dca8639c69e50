#include "optim/divergence_check.hpp"

#include <algorithm>
#include <bitset>
#include <cmath>

#include "base/error.hpp"
#include "state/blob.hpp"

namespace dsopt {
namespace {

// How far one observation may pull the reference: x enters clamped to r +- this.
const double kBand = std::log(2.0);

struct Fields {
  int64_t seen[2];
  double r[2];
  uint64_t recent;
  int32_t diverging;
};

Fields read(const uint8_t* bytes) {
  FieldReader f(bytes, DivergenceCheck::kStateBytes);
  Fields s;
  for (int k = 0; k < 2; ++k) {
    s.seen[k] = f.get<int64_t>();
    s.r[k] = f.get<double>();
  }
  s.recent = f.get<uint64_t>();
  s.diverging = f.get<int32_t>();
  return s;
}

}  // namespace

bool DivergenceCheck::observe(double grad_norm, bool local, int world) {
  if (!cfg_.enabled || !(grad_norm > 0.0)) return diverging_;  // off; NaN, zero, or not computed
  const double x = std::log(grad_norm);       // +Inf for an infinite norm
  Reference& ref = kinds_[local ? 1 : 0];
  const Reference& other = kinds_[local ? 0 : 1];
  if (ref.seen == 0 && other.seen > 0) {  // the kind's first step: start from the other's
    ref.seen = other.seen;
    ref.r = other.r + (local ? 0.5 : -0.5) * std::log(double(world));
  }
  const bool above = ref.seen >= cfg_.min_steps && x - ref.r > std::log(cfg_.factor);
  const uint64_t mask = cfg_.window >= 64 ? ~uint64_t(0) : (uint64_t(1) << cfg_.window) - 1;
  recent_ = ((recent_ << 1) | (above ? 1u : 0u)) & mask;
  if (!diverging_ && int(std::bitset<64>(recent_).count()) >= cfg_.count) diverging_ = true;
  else if (diverging_ && recent_ == 0) diverging_ = false;
  if (std::isfinite(x)) {
    if (ref.seen == 0) {
      ref.r = x;
    } else {
      const double w = std::max(1.0 / double(ref.seen + 1), 1.0 / double(cfg_.horizon));
      ref.r += w * (std::clamp(x, ref.r - kBand, ref.r + kBand) - ref.r);
    }
    ++ref.seen;
  }
  return diverging_;
}

std::vector<uint8_t> DivergenceCheck::save() const {
  FieldWriter f;
  for (const Reference& ref : kinds_) f.add(ref.seen).add(ref.r);
  f.add(recent_).add(int32_t(diverging_ ? 1 : 0));
  return f.bytes();
}

void DivergenceCheck::check(const uint8_t* bytes) {
  const Fields s = read(bytes);
  for (int k = 0; k < 2; ++k)
    if (s.seen[k] < 0 || !std::isfinite(s.r[k]))
      fail(DSOPT_ECORRUPT, "state blob: the divergence check's state is not valid");
  if (s.diverging != 0 && s.diverging != 1)
    fail(DSOPT_ECORRUPT, "state blob: the divergence check's state is not valid");
}

void DivergenceCheck::restore(const uint8_t* bytes) {
  const Fields s = read(bytes);
  for (int k = 0; k < 2; ++k) kinds_[k] = Reference{s.seen[k], s.r[k]};
  recent_ = s.recent;
  diverging_ = s.diverging != 0;
}

void DivergenceCheck::reset() {
  kinds_[0] = kinds_[1] = Reference{};
  recent_ = 0;
  diverging_ = false;
}

}  // namespace dsopt
