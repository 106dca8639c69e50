// DSOPT_HD marks functions compiled for host and device alike (g++ and nvcc).
//
// DSOPT_ISA_BEGIN / DSOPT_ISA_END enclose the inline *functions* of the math
// and CPU kernel headers in an inline namespace named per translation unit
// (DSOPT_ISA_TAG, set by the build for the AVX2/AVX-512 files). Without it
// the linker would merge, say, the AVX-512-compiled copy of an inline
// function with the portable one and could run AVX-512 code on a CPU without
// it. Plain data types stay outside so every file shares them.
#pragma once

#if defined(__CUDACC__)
#define DSOPT_HD __host__ __device__ __forceinline__
#else
#define DSOPT_HD inline
#endif

#ifndef DSOPT_ISA_TAG
#define DSOPT_ISA_TAG portable
#endif
#define DSOPT_ISA_BEGIN inline namespace DSOPT_ISA_TAG {
#define DSOPT_ISA_END }
