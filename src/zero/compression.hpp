// zero_optimization.compression (docs/guides/compressed-zero.md): the
// codecs of ZeRO's gradient reduce-scatter and parameter allgather.
#pragma once
#include <cstdint>
#include <optional>

#include "math/block_codec.hpp"

namespace dsopt {

enum class GradientCodec { None, Int8, Int4, Sign };
enum class ParamCodec { None, Bf16, Int8 };

struct ZeroCompression {
  GradientCodec gradients = GradientCodec::None;
  ParamCodec parameters = ParamCodec::None;
  bool error_feedback = true;  // with a gradient codec: each rank keeps a residual
  int64_t gradient_block = 64;    // elements per scaled block of a gradient codec
  int64_t parameter_block = 256;  // ... of the int8 parameter codec
};

// The block codec of a gradient codec (none for GradientCodec::None).
inline std::optional<BlockCodec> block_codec(GradientCodec g) {
  switch (g) {
    case GradientCodec::Int8: return BlockCodec::Int8;
    case GradientCodec::Int4: return BlockCodec::Int4;
    case GradientCodec::Sign: return BlockCodec::Sign;
    case GradientCodec::None: break;
  }
  return std::nullopt;
}

}  // namespace dsopt
