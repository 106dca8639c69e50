// Scratch bytes for the collectives' temporaries: a vector whose elements
// are left unset, since a transfer or a sum writes every byte before it is
// read (value-initialised bytes would cost a pass over the buffer per call).
#pragma once
#include <vector>

namespace dsopt {

struct RawByte {
  char c;
  RawByte() {}  // NOLINT(modernize-use-equals-default): no initialisation on purpose
};
using Scratch = std::vector<RawByte>;

}  // namespace dsopt
