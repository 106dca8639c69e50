// The CPU kernels instantiated for avx512 (this file alone gets the ISA's
// compiler flags; it runs only where cpu_kernels.cpp found the CPU able to).
#define DSOPT_ISA_TAG isa_avx512
#include "kernels/cpu/vec_avx512.hpp"
#include "kernels/cpu/isa_table.hpp"

namespace dsopt {

const CpuIsa& cpu_isa_avx512() {
  static const CpuIsa isa = cpu::make_isa<VecAvx512>();
  return isa;
}

}  // namespace dsopt
