// FieldReader::get: reads the next plain value of a small section.
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

}  // namespace dsopt
