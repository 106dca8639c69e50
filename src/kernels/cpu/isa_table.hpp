// The table of one instruction set's CPU kernels (cpu_isa.hpp), filled from
// the templates; included only by the isa_*.cpp files.
#pragma once
#include "kernels/cpu/cpu_car_loops.hpp"
#include "kernels/cpu/cpu_codec_loops.hpp"
#include "kernels/cpu/cpu_loops.hpp"
#include "kernels/cpu/update_loop.hpp"

namespace dsopt {
DSOPT_ISA_BEGIN
namespace cpu {

template <class V>
CpuIsa make_isa() {
  return CpuIsa{V::name(),
                &update_range<V>,
                &transform_blocks<V>,
                &check_range<V>,
                &from_float_range<V>,
                &car_worker_sumsq_block<V>,
                &car_worker_pack_block<V>,
                &car_server_sum_block<V>,
                &car_server_pack_block<V>,
                &car_decode_block<V>,
                &codec_encode_blocks<V>,
                &codec_decode_blocks<V>};
}

}  // namespace cpu
DSOPT_ISA_END
}  // namespace dsopt
