// CPU kernels of the compressed allreduce (see Kernels::car_*): the
// instruction set's block loops run over every block of every tensor.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_isa.hpp"

namespace dsopt {
namespace cpu_car {

void worker_sumsq(const CpuIsa& isa, const CarTensor* t, int64_t count, int threads, double* sumsq);
void worker_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales, uint8_t* send,
                 int64_t msg_bytes, int threads);
void server_sum(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* recv, int64_t msg_bytes,
                const float* weights, double* sumsq, int threads);
void server_pack(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const float* scales, uint8_t* out,
                 int threads);
void decode(const CpuIsa& isa, const CarTensor* t, int64_t count, int world, const uint8_t* gathered, int64_t msg_bytes,
            const float* scales, int threads);

}  // namespace cpu_car
}  // namespace dsopt
