// Every update rule, once: X(enumerator of UpdateRule, functor). The enum
// (src/kernels/kernels.hpp), the CPU dispatch (src/kernels/cpu/update_loop.hpp)
// and the CUDA dispatch (cuda/update.cu) are expanded from this list; a new
// rule is its functor in its math header plus one line here.
#pragma once
#include "math/adam.hpp"
#include "math/lion.hpp"
#include "math/onebit_adam.hpp"
#include "math/onebit_lamb.hpp"
#include "math/sgd.hpp"
#include "math/zero_one_adam.hpp"

#define DSOPT_UPDATE_RULES(X)                           \
  X(Adam, AdamRule)                                     \
  X(OneBitWarmup, OneBitWarmupRule)                     \
  X(OneBitMomentum, OneBitMomentumRule)                 \
  X(OneBitApply, OneBitApplyRule)                       \
  X(LambWarmup, LambWarmupRule)                         \
  X(LambMomentum, LambMomentumRule)                     \
  X(LambCompressed, LambCompressedRule)                 \
  X(LambApply, LambApplyRule)                           \
  X(ZeroOneGradientPrepare, ZeroOneGradientPrepareRule) \
  X(ZeroOneGradient, ZeroOneGradientRule)               \
  X(ZeroOneLocal, ZeroOneLocalRule)                     \
  X(ZeroOneSyncPrepare, ZeroOneSyncPrepareRule)         \
  X(ZeroOneSyncApply, ZeroOneSyncApplyRule)             \
  X(Lion, LionRule)                                     \
  X(Sgd, SgdRule)
