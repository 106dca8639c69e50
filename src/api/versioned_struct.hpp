// The rule every versioned struct of dsopt.h follows (the header's top
// comment): the library reads or writes only the first
// min(struct_size, sizeof) bytes. An input struct gets this library's
// defaults for the fields past a caller's struct_size; an output struct's
// fields past it are left unwritten. A struct_size below the struct's
// first layout is DSOPT_EINVAL.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.hpp"

namespace dsopt {

// Bytes of a struct of this library's `known` size that a caller's
// `struct_size` covers; fails naming `what` below `min_size`.
inline size_t versioned_bytes(uint32_t struct_size, size_t known, size_t min_size,
                              const char* what) {
  if (struct_size < min_size)
    fail(DSOPT_EINVAL, std::string(what) + ".struct_size is " + std::to_string(struct_size) +
                           ", below the smallest layout (" + std::to_string(min_size) +
                           " bytes): set it to sizeof(" + what + ")");
  return std::min<size_t>(struct_size, known);
}

// The caller's input struct over `defaults` (its tail), with struct_size
// set to this library's size.
template <class T>
T read_versioned(const T& in, T defaults, size_t min_size, const char* what) {
  std::memcpy(&defaults, &in, versioned_bytes(in.struct_size, sizeof(T), min_size, what));
  defaults.struct_size = uint32_t(sizeof(T));
  return defaults;
}

// Checks an output struct's struct_size before any work is done.
template <class T>
void check_versioned(const T& out, size_t min_size, const char* what) {
  versioned_bytes(out.struct_size, sizeof(T), min_size, what);
}

// Writes `full` into the caller's output struct, up to its struct_size.
// struct_size itself is kept as the caller set it.
template <class T>
void write_versioned(T& out, T full, size_t min_size, const char* what) {
  full.struct_size = out.struct_size;
  std::memcpy(&out, &full, versioned_bytes(out.struct_size, sizeof(T), min_size, what));
}

}  // namespace dsopt
