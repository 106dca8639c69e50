// FieldReader::get and FieldReader::take: read the next values of a small section.
#pragma once
#include <cstring>

#include "base/error.hpp"

namespace dsopt {

template <class T>
T FieldReader::get() {
  if (pos_ + sizeof(T) > n_) fail(DSOPT_ECORRUPT, "state blob: a section is shorter than its fields");
  T v;
  std::memcpy(&v, p_ + pos_, sizeof(T));
  pos_ += sizeof(T);
  return v;
}

inline const uint8_t* FieldReader::take(uint64_t n) {
  if (pos_ + n > n_) fail(DSOPT_ECORRUPT, "state blob: a section is shorter than its fields");
  const uint8_t* p = p_ + pos_;
  pos_ += n;
  return p;
}

}  // namespace dsopt
