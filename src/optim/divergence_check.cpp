#include "optim/divergence_check.hpp"

#include <algorithm>
#include <bitset>
#include <cmath>

#include "base/error.hpp"
#include "state/blob.hpp"

namespace dsopt {
namespace {

struct Fields {
  int64_t observed;
  double reference;
  uint64_t recent;
  int32_t diverging;
};

Fields read(const uint8_t* bytes) {
  FieldReader f(bytes, DivergenceCheck::kStateBytes);
  Fields s;
  s.observed = f.get<int64_t>();
  s.reference = f.get<double>();
  s.recent = f.get<uint64_t>();
  s.diverging = f.get<int32_t>();
  return s;
}

}  // namespace

bool DivergenceCheck::observe(double grad_norm) {
  if (!(grad_norm > 0.0)) return diverging_;  // NaN, zero, or not computed
  const double x = std::log(grad_norm);       // +Inf for an infinite norm
  const double band = std::log(cfg_.factor);
  const bool above = observed_ >= cfg_.min_steps && x - reference_ > band;
  const uint64_t mask = cfg_.window >= 64 ? ~uint64_t(0) : (uint64_t(1) << cfg_.window) - 1;
  recent_ = ((recent_ << 1) | (above ? 1u : 0u)) & mask;
  if (!diverging_ && int(std::bitset<64>(recent_).count()) >= cfg_.count) diverging_ = true;
  else if (diverging_ && recent_ == 0) diverging_ = false;
  if (std::isfinite(x)) {
    if (observed_ == 0) {
      reference_ = x;
    } else {
      const double w = std::max(1.0 / double(observed_ + 1), 1.0 / double(cfg_.horizon));
      reference_ += w * (std::clamp(x, reference_ - band, reference_ + band) - reference_);
    }
    ++observed_;
  }
  return diverging_;
}

std::vector<uint8_t> DivergenceCheck::save() const {
  FieldWriter f;
  f.add(observed_).add(reference_).add(recent_).add(int32_t(diverging_ ? 1 : 0));
  return f.bytes();
}

void DivergenceCheck::check(const uint8_t* bytes) {
  const Fields s = read(bytes);
  if (s.observed < 0 || !std::isfinite(s.reference) || (s.diverging != 0 && s.diverging != 1))
    fail(DSOPT_ECORRUPT, "state blob: the divergence check's state is not valid");
}

void DivergenceCheck::restore(const uint8_t* bytes) {
  const Fields s = read(bytes);
  observed_ = s.observed;
  reference_ = s.reference;
  recent_ = s.recent;
  diverging_ = s.diverging != 0;
}

void DivergenceCheck::reset() {
  observed_ = 0;
  reference_ = 0.0;
  recent_ = 0;
  diverging_ = false;
}

}  // namespace dsopt
