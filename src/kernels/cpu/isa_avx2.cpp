// The CPU kernels instantiated for avx2 (this file alone gets the ISA's
// compiler flags; it runs only where cpu_kernels.cpp found the CPU able to).
#define DSOPT_ISA_TAG isa_avx2
#include "kernels/cpu/vec_avx2.hpp"
#include "kernels/cpu/isa_table.hpp"

namespace dsopt {

const CpuIsa& cpu_isa_avx2() {
  static const CpuIsa isa = cpu::make_isa<VecAvx2>();
  return isa;
}

}  // namespace dsopt
