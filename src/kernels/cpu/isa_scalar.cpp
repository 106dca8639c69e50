// The CPU kernels instantiated for scalar (this file alone gets the ISA's
// compiler flags; it runs only where cpu_kernels.cpp found the CPU able to).
#include "kernels/cpu/vec_scalar.hpp"
#include "kernels/cpu/isa_table.hpp"

namespace dsopt {

const CpuIsa& cpu_isa_scalar() {
  static const CpuIsa isa = cpu::make_isa<VecScalar>();
  return isa;
}

}  // namespace dsopt
