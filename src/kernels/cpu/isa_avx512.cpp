// The CPU kernels instantiated for avx512 (this file alone gets the ISA's
// compiler flags; it runs only where cpu_kernels.cpp found the CPU able to).
#define DSOPT_ISA_TAG isa_avx512
// g++ 12 implements many AVX-512 intrinsics as masked builtins with an
// "undefined" pass-through vector and a full mask, and reports that vector
// as uninitialized once they are inlined into the staged tails
// (update_loop.hpp apply_tail); a full mask never reads it.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/vec_avx512.hpp"
#include "kernels/cpu/isa_table.hpp"

namespace dsopt {

const CpuIsa& cpu_isa_avx512() {
  static const CpuIsa isa = cpu::make_isa<VecAvx512>();
  return isa;
}

}  // namespace dsopt
